"""Loading and saving a `Run` (the unit of work of every execution change) in SQL.

Lock order, the same for every writer so that no two can deadlock: the execution row
first (`FOR UPDATE OF e`), then its step rows. Heartbeats touch only the lease of a
running step and never wait on anything else.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flowforge import flowcontrol, metrics, tracing
from flowforge.cache import BoundedCache
from flowforge.db import one, pipelined_transaction
from flowforge.definitions import Definition, parse_definition
from flowforge.engine import Changes, Run, StepState
from flowforge.model import TERMINAL_EXECUTION, StepStatus
from flowforge.outbox import INSERT_WAKEUPS, NOTIFY_IF_PENDING
from flowforge.waits import APPLY_RESUMES, PENDING_RESUMES

logger = logging.getLogger(__name__)

# Locks the execution row: every change to an execution and its steps starts here. It
# also gives the transaction back the configured synchronous_commit, which the relay's
# claim turned off for itself before it runs a pure step in the same transaction
# (outbox.TAKE_BATCH kept the value): progress is never committed with less durability
# than the server, database or role asks for. One statement less than a SET of its own;
# elsewhere it sets the value the transaction already has.
LOCK_EXECUTION = """
SELECT e.status, e.input, e.cancel_requested_at IS NOT NULL AS cancel_requested,
       set_config('synchronous_commit',
                  coalesce(nullif(current_setting('flowforge.synchronous_commit', true), ''),
                           current_setting('synchronous_commit')),
                  true) AS synchronous_commit,
       e.version_id, w.key AS workflow, v.version, now() AS now,
       e.workflow_id, e.concurrency_key, e.stop_reason,
       e.slot_at IS NOT NULL AND e.cancel_requested_at IS NULL
           AND e.status IN ('queued', 'running', 'waiting', 'paused', 'needs_attention')
           AS held_slot,
       coalesce(e.deadline_at <= now(), false) AS deadline_passed,
       coalesce(e.expires_at <= now(), false) AS expired, e.traceparent,
       e.paused_from, e.pause_reason,
       CASE WHEN w.paused_at IS NOT NULL THEN coalesce(w.paused_by, '{}'::jsonb) END
           AS workflow_paused_by
FROM executions e
JOIN workflows w ON w.id = e.workflow_id
JOIN workflow_versions v ON v.id = e.version_id
WHERE e.id = %(id)s
FOR UPDATE OF e
"""
# For passes over many executions (lease recovery, time limits): one that another session
# holds locked is skipped and retried in the next pass, never waited for.
LOCK_EXECUTION_SKIP_LOCKED = LOCK_EXECUTION + "SKIP LOCKED\n"
# Reads every step of the locked execution; whether a lease ran out is decided by now().
LOAD_STEPS = """
SELECT step_id, type, status, attempts, fencing_token, wake_at, output, error, lease_owner,
       started_at, finished_at, lease_expires_at < now() AS lease_expired
FROM steps WHERE execution_id = %(id)s
"""
LOAD_DEFINITION = "SELECT definition FROM workflow_versions WHERE id = %(id)s"

# Everything a unit of work changed, in one statement: each statement in a pipeline is
# its own message for the client to build and the server to parse, bind and run, and a
# unit of work used to send up to nine. Each part is fed one JSON array of rows (json.dumps
# runs in C; psycopg dumps array parameters element by element in Python) and writes
# nothing when its array is empty. The parts see one snapshot and touch different rows,
# so they cannot see or undo each other: a new attempt is numbered from the rows that
# were there before (its step's earlier tries), an attempt is finished only if it was
# open before, a step row is updated once. The foreign keys are checked at the end of
# the statement; the relay's NOTIFY follows the COMMIT (unit_of_work), outside it.
#
# steps: a step claimed in this unit of work gets its lease (lease_s); a running step
# that was not claimed here keeps the lease it has. attempts: numbered in the order given
# within each step. execution: written only when `execution_changed`.
SAVE_RUN = f"""
WITH saved_steps AS (
    UPDATE steps s SET
        status = c.status, attempts = c.attempts, fencing_token = c.fencing_token,
        wake_at = c.wake_at, output = c.output, error = c.error, lease_owner = c.lease_owner,
        lease_expires_at = CASE WHEN c.status = 'running'
                                THEN coalesce(now() + make_interval(secs => c.lease_s),
                                              s.lease_expires_at) END,
        ready_at = CASE WHEN c.status = 'ready' THEN now() ELSE s.ready_at END,
        failed_wakeups = 0, recovery_failures = 0,
        started_at = c.started_at, finished_at = c.finished_at
    FROM jsonb_to_recordset(%(steps)s)
         AS c(step_id text, status text, attempts integer, fencing_token bigint,
              wake_at timestamptz, output jsonb, error text, lease_owner text, lease_s float8,
              started_at timestamptz, finished_at timestamptz)
    WHERE s.execution_id = %(execution_id)s AND s.step_id = c.step_id
), finished_attempts AS (
    UPDATE attempts a SET
        finished_at = clock_timestamp(), outcome = f.outcome, error = f.error,
        http_status = f.http_status, duration_ms = f.duration_ms, response = f.response
    FROM jsonb_to_recordset(%(finished_attempts)s)
         AS f(step_id text, fencing_token bigint, outcome text, error text,
              http_status integer, duration_ms integer, response jsonb)
    WHERE a.execution_id = %(execution_id)s AND a.step_id = f.step_id
      AND a.fencing_token = f.fencing_token AND a.outcome IS NULL
), new_attempts AS (
    INSERT INTO attempts (execution_id, step_id, attempt, fencing_token, worker, finished_at,
                          outcome, error, http_status, duration_ms, request)
    SELECT %(execution_id)s, a.step_id,
           (SELECT coalesce(max(attempt), 0) FROM attempts
            WHERE execution_id = %(execution_id)s AND step_id = a.step_id)
           + row_number() OVER (PARTITION BY a.step_id ORDER BY a.n),
           a.fencing_token, a.worker,
           CASE WHEN a.outcome IS NULL THEN NULL ELSE clock_timestamp() END,
           a.outcome, a.error, a.http_status, a.duration_ms, a.request
    FROM ROWS FROM (jsonb_to_recordset(%(new_attempts)s)
                    AS (step_id text, fencing_token bigint, worker text, outcome text,
                        error text, http_status integer, duration_ms integer, request jsonb))
         WITH ORDINALITY
         AS a(step_id, fencing_token, worker, outcome, error, http_status, duration_ms,
              request, n)
    ORDER BY a.n
), events AS (
    INSERT INTO execution_events (execution_id, step_id, kind, detail)
    SELECT %(execution_id)s, e.step_id, e.kind, e.detail
    FROM ROWS FROM (jsonb_to_recordset(%(events)s) AS (step_id text, kind text, detail jsonb))
         WITH ORDINALITY AS e(step_id, kind, detail, n)
    ORDER BY e.n
), applied_resumes AS (
    {APPLY_RESUMES}
), wakeups AS (
    {INSERT_WAKEUPS}
    SELECT %(execution_id)s, d.step_id
    FROM jsonb_array_elements_text(%(dispatch)s) WITH ORDINALITY AS d(step_id, n)
    ORDER BY d.n
    RETURNING 1
), execution AS (
    UPDATE executions SET
        status = %(status)s, updated_at = now(),
        started_at = CASE WHEN %(status)s = 'paused' THEN started_at
                          WHEN %(status)s <> 'queued' THEN coalesce(started_at, now()) END,
        finished_at = CASE WHEN %(terminal)s THEN coalesce(finished_at, now()) END,
        cancel_requested_at = CASE WHEN %(cancel_requested)s
                                   THEN coalesce(cancel_requested_at, now()) END,
        stop_reason = %(stop_reason)s,
        paused_from = %(paused_from)s, pause_reason = %(pause_reason)s
    WHERE id = %(execution_id)s AND %(execution_changed)s
)
SELECT count(*) FROM (SELECT FROM wakeups LIMIT 1) AS woken
"""

DEFINITION_CACHE_SIZE = 1024
_definitions: BoundedCache[tuple[str, int], Definition] = BoundedCache(DEFINITION_CACHE_SIZE)


@contextmanager
def unit_of_work(conn: psycopg.Connection) -> Iterator[None]:
    """One pipelined transaction: BEGIN, the lock and the reads travel in one round trip,
    the writes and the COMMIT in another (save_run adds no sync of its own). What it did is
    counted after the COMMIT."""
    with metrics.after_commit(), pipelined_transaction(conn, then=NOTIFY_IF_PENDING):
        yield


def definition_for(conn: psycopg.Connection, version_id: int) -> Definition:
    """Parse a version's definition once per process: versions are immutable."""
    # Keyed by database too: version ids restart at 1 in every database, and one process
    # (the test suite's in-process app) may serve several.
    key = (conn.info.dbname, version_id)
    cached = _definitions.get(key)
    if cached is not None:
        return cached
    row = one(conn.execute(LOAD_DEFINITION, {"id": version_id}))
    definition = parse_definition(row[0], stored=True)
    _definitions.put(key, definition)
    return definition


def load_run(
    conn: psycopg.Connection, execution_id: str, *, skip_locked: bool = False
) -> Run | None:
    """Lock an execution and load it (each step says whether its lease has run out); None
    when it does not exist or, with `skip_locked`, when another session holds it locked.

    Both reads are sent before either is fetched: in a unit of work's pipeline they travel
    in one round trip, and the server still runs the lock first."""
    with conn.cursor(row_factory=dict_row) as cur, conn.cursor(row_factory=dict_row) as steps:
        cur.execute(
            LOCK_EXECUTION_SKIP_LOCKED if skip_locked else LOCK_EXECUTION, {"id": execution_id}
        )
        steps.execute(LOAD_STEPS, {"id": execution_id})
        head = cur.fetchone()
        if head is None:
            return None
        rows = steps.fetchall()
    definition = definition_for(conn, head["version_id"])
    run = Run(
        execution_id=str(execution_id),
        workflow=head["workflow"],
        version=head["version"],
        status=head["status"],
        input=head["input"],
        definition=definition,
        steps={row["step_id"]: StepState(**row) for row in rows},
        now=head["now"],
        cancel_requested=head["cancel_requested"],
        stop_reason=head["stop_reason"],
        workflow_id=head["workflow_id"],
        concurrency_key=head["concurrency_key"],
        held_slot=head["held_slot"],
        deadline_passed=head["deadline_passed"],
        expired=head["expired"],
        paused_from=head["paused_from"],
        pause_reason=head["pause_reason"],
        workflow_paused_by=head["workflow_paused_by"],
        traceparent=head["traceparent"],
    )
    if definition.wait_steps():
        # Only workflows with wait steps pay for this read (SPEC §10: no lost early resume).
        resumes = conn.execute(PENDING_RESUMES, {"id": execution_id}).fetchall()
        run.early_resumes = {step_id: body for step_id, body in resumes}
    return run


def save_run(conn: psycopg.Connection, changes: Changes) -> None:
    """Write what a unit of work changed (Run.take_changes), in the caller's transaction."""
    eid = changes.execution_id
    metrics.saved(changes)
    if tracing.active():
        metrics.on_commit(functools.partial(tracing.saved, changes))
    dispatch = [s for s in changes.dispatch if changes.steps[s].status == StepStatus.READY]
    params = {
        "execution_id": eid,
        "steps": _rows(_step_row(s, changes.leases.get(s.step_id)) for s in changes.steps.values()),
        "finished_attempts": _rows(vars(a) for a in changes.finished_attempts),
        "new_attempts": _rows(vars(a) for a in changes.new_attempts),
        "events": _rows(
            {"step_id": step_id, "kind": kind, "detail": detail}
            for step_id, kind, detail in changes.events
        ),
        "applied_resumes": _rows(changes.applied_resumes),
        "dispatch": _rows(dispatch),
        "execution_changed": changes.execution_changed,
        "status": changes.status,
        "terminal": changes.status in TERMINAL_EXECUTION,
        "cancel_requested": changes.cancel_requested,
        "stop_reason": changes.stop_reason,
        "paused_from": changes.paused_from,
        "pause_reason": changes.pause_reason,
    }
    # In a unit of work's pipeline it travels with the COMMIT that follows.
    conn.execute(SAVE_RUN, params)
    if changes.released_slot is not None:
        # The slot this execution held is free: the next of its key starts in this same
        # transaction (lock order: this execution's row, then the key's slot lock).
        flowcontrol.fill_slots(conn, *changes.released_slot)


def _instant(value: Any) -> str:
    """Timestamps in a JSON document of rows, as jsonb_to_recordset parses them."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_dump_rows = functools.partial(json.dumps, default=_instant)


def _rows(rows: Iterable[Any]) -> Jsonb:
    """Rows (or values) as one JSON array, for a part of SAVE_RUN."""
    return Jsonb(list(rows), dumps=_dump_rows)


def _step_row(state: StepState, lease_s: float | None) -> dict[str, Any]:
    return {
        "step_id": state.step_id,
        "status": state.status,
        "attempts": state.attempts,
        "fencing_token": state.fencing_token,
        "wake_at": state.wake_at,
        "output": state.output,
        "error": state.error,
        "lease_owner": state.lease_owner,
        "lease_s": None if lease_s is None else float(lease_s),
        "started_at": state.started_at,
        "finished_at": state.finished_at,
    }
