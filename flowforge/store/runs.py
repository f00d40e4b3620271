"""Loading and saving a `Run` (the unit of work of every execution change) in SQL.

Lock order, the same for every writer so that no two can deadlock: the execution row
first (`FOR UPDATE OF e`), then its step rows. Heartbeats touch only the lease of a
running step and never wait on anything else.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flowforge import faults
from flowforge.cache import BoundedCache
from flowforge.domain.definitions import Definition, parse_definition
from flowforge.domain.engine import KINDS, Changes, Run, StepState
from flowforge.domain.failures import recorded
from flowforge.domain.kinds.workflow import ChildState, ChildTarget
from flowforge.domain.model import (
    PARENT_CANCEL_ACTOR,
    TERMINAL_EXECUTION,
    ExecutionStatus,
    PauseReason,
    StepStatus,
    StopReason,
)
from flowforge.store import children, events, failures, flowcontrol
from flowforge.store.creation import uuid7
from flowforge.store.db import COMMIT_WITHOUT_FLUSH, FLUSH_BARRIER, one, pipelined_transaction
from flowforge.store.outbox import INSERT_WAKEUPS, NOTIFY_IF_PENDING
from flowforge.store.waits import APPLY_RESUMES, PENDING_RESUMES

logger = logging.getLogger(__name__)

# Locks the execution row: every change to an execution and its steps starts here. It
# also gives the transaction back the configured synchronous_commit, which the relay's
# claim turned off for itself before it runs a pure step in the same transaction
# (outbox.TAKE_BATCH kept the value): progress is never committed with less durability
# than the server, database or role asks for. One statement less than a SET of its own;
# elsewhere it sets the value the transaction already has.
LOCK_EXECUTION = f"""
SELECT e.status, e.input, e.cancel_requested_at IS NOT NULL AS cancel_requested,
       set_config('synchronous_commit',
                  coalesce(nullif(current_setting('flowforge.synchronous_commit', true), ''),
                           current_setting('synchronous_commit')),
                  true) AS synchronous_commit,
       e.version_id, w.key AS workflow, v.version, now() AS now,
       e.workflow_id, e.concurrency_key, e.stop_reason,
       {flowcontrol.holds_slot("e")} AS held_slot,
       coalesce(e.deadline_at <= now(), false) AS deadline_passed,
       coalesce(e.expires_at <= now(), false) AS expired, e.traceparent,
       e.paused_from, e.pause_reason, e.depth, e.parent_id::text AS parent_id, e.parent_step,
       e.root_id::text AS root_id,
       CASE WHEN w.paused_at IS NOT NULL THEN coalesce(w.paused_by, '{{}}'::jsonb) END
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
_STEP_COLUMNS = """step_id, type, status, attempts, fencing_token, wake_at, output, error,
       lease_owner, started_at, finished_at, lease_expires_at < now() AS lease_expired"""
# A worker's unit of work (load_run(open_items=True)) reads a map's open items only
# (docs/contract.md#map): the workflow's own steps, and every row of each item that has a row still
# to run (pending, ready, running or waiting: in flight, or queued again by a retry) or that the
# caller names (`also`: the step of its wake-up or checkpoint). The other started items'
# rows are settled — succeeded, skipped, failed, cancelled, unknown — and only which of
# the last three are among them is read (SETTLED); how many items started is in the
# map's output. Both read through partial indexes (0033): a map of 10,000 items costs
# a unit of work what its items in flight cost. The maps' bodies come from the stored
# definition, in the same statement, so that the reads still travel with the lock; the
# open items' rows are named as one array (ANY(ARRAY(...))), so that they are looked up
# by primary key whatever the planner guesses of the item counts.
# The last part of LOAD_OPEN_STEPS is not rows but, for each map, the statuses among its
# settled items' rows that are neither succeeded nor skipped, as (map id, SETTLED, status):
# one statement less in every unit of work than a query of its own.
SETTLED = "settled"
_OPEN_ITEMS = """
bodies AS (
    SELECT m->>'id' AS map, b->>'id' AS local
    FROM executions e JOIN workflow_versions v ON v.id = e.version_id,
         jsonb_array_elements(v.definition->'steps') AS m,
         jsonb_array_elements(m->'steps') AS b
    WHERE e.id = %(id)s AND m->>'type' = 'map'
), open_items AS (
    SELECT left(step_id, strpos(step_id, ']')) AS item FROM steps
    WHERE execution_id = %(id)s AND strpos(step_id, '[') > 0
      AND status NOT IN ('succeeded', 'skipped')
      AND status IN ('pending', 'ready', 'running', 'waiting')
    UNION
    SELECT left(a, strpos(a, ']')) FROM unnest(%(also)s::text[]) AS a WHERE strpos(a, '[') > 0
)"""
LOAD_OPEN_STEPS = f"""
WITH {_OPEN_ITEMS}
SELECT {_STEP_COLUMNS} FROM steps WHERE execution_id = %(id)s AND strpos(step_id, '[') = 0
UNION ALL
SELECT {_STEP_COLUMNS} FROM steps
WHERE execution_id = %(id)s
  AND step_id = ANY(ARRAY(SELECT o.item || '.' || b.local FROM open_items o
                          JOIN bodies b ON b.map = split_part(o.item, '[', 1)))
UNION ALL
SELECT DISTINCT split_part(step_id, '[', 1), '{SETTLED}', status, NULL::integer,
       NULL::bigint, NULL::timestamptz, NULL::jsonb, NULL, NULL, NULL::timestamptz,
       NULL::timestamptz, NULL::boolean
FROM steps
WHERE execution_id = %(id)s AND strpos(step_id, '[') > 0
  AND status NOT IN ('succeeded', 'skipped')
  AND left(step_id, strpos(step_id, ']')) NOT IN (SELECT item FROM open_items)
"""
# Every row of one map's items: what a unit of work that loaded only the open ones reads
# when the map needs them all (Run.load_items): once, when the map ends or starts again.
LOAD_MAP_ROWS = f"""
SELECT {_STEP_COLUMNS} FROM steps
WHERE execution_id = %(id)s AND starts_with(step_id, %(prefix)s)
"""

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
# that was not claimed here keeps the lease it has. new_steps: rows created in this unit
# of work (a map's items as they start, docs/contract.md#map), with the map's position and the
# execution's priority. attempts:
# numbered in the order given within each step. execution: written only when `execution_changed`.
_SAVE_RUN = """
WITH {failure_group}saved_steps AS (
    UPDATE steps s SET
        status = c.status, attempts = c.attempts, fencing_token = c.fencing_token,
        wake_at = c.wake_at, output = c.output, error = c.error, lease_owner = c.lease_owner,
        lease_expires_at = CASE WHEN c.status = 'running'
                                THEN coalesce(now() + make_interval(secs => c.lease_s),
                                              s.lease_expires_at) END,
        ready_at = CASE WHEN c.status = 'ready' THEN now() ELSE s.ready_at END,
        ready_since = CASE WHEN c.status <> 'ready' THEN NULL
                           WHEN s.status = 'ready' THEN coalesce(s.ready_since, now())
                           ELSE now() END,
        failed_wakeups = 0, recovery_failures = 0,
        started_at = c.started_at, finished_at = c.finished_at
    FROM jsonb_to_recordset(%(steps)s)
         AS c(step_id text, status text, attempts integer, fencing_token bigint,
              wake_at timestamptz, output jsonb, error text, lease_owner text, lease_s float8,
              started_at timestamptz, finished_at timestamptz)
    WHERE s.execution_id = %(execution_id)s AND s.step_id = c.step_id
), new_steps AS (
    INSERT INTO steps (execution_id, step_id, type, position, status, attempts, fencing_token,
                       wake_at, output, error, ready_at, ready_since, started_at, finished_at,
                       priority)
    SELECT %(execution_id)s, c.step_id, c.type,
           (SELECT m.position FROM steps m
            WHERE m.execution_id = %(execution_id)s AND m.step_id = split_part(c.step_id, '[', 1)),
           c.status, c.attempts, c.fencing_token, c.wake_at, c.output, c.error,
           CASE WHEN c.status = 'ready' THEN now() END,
           CASE WHEN c.status = 'ready' THEN now() END, c.started_at, c.finished_at,
           (SELECT e.priority FROM executions e WHERE e.id = %(execution_id)s)
    FROM jsonb_to_recordset(%(new_steps)s)
         AS c(step_id text, type text, status text, attempts integer, fencing_token bigint,
              wake_at timestamptz, output jsonb, error text, started_at timestamptz,
              finished_at timestamptz)
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
    {applied_resumes}
), wakeups AS (
    {insert_wakeups}
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
        paused_from = %(paused_from)s, pause_reason = %(pause_reason)s{link}
    WHERE id = %(execution_id)s AND %(execution_changed)s
)
SELECT count(*){opened} FROM (SELECT FROM wakeups LIMIT 1) AS woken
"""
SAVE_RUN = _SAVE_RUN.format(
    failure_group="",
    applied_resumes=APPLY_RESUMES,
    insert_wakeups=INSERT_WAKEUPS,
    link="",
    opened="",
)
# docs/contract.md#failure-groups: the unit of work in which the execution becomes failed or
# needs an operator also counts its failure group and links the execution to it, in the
# same UPDATE of its row; every other unit of work runs SAVE_RUN, which has no part of it.
SAVE_RUN_FAILING = _SAVE_RUN.format(
    failure_group=failures.UPSERT_CTE.strip() + ", ",
    applied_resumes=APPLY_RESUMES,
    insert_wakeups=INSERT_WAKEUPS,
    link=",\n        failure_group_id = (SELECT id FROM failure_group)",
    opened=", (SELECT opened FROM failure_group)",
)

DEFINITION_CACHE_SIZE = 1024
_definitions: BoundedCache[tuple[str, int], Definition] = BoundedCache(DEFINITION_CACHE_SIZE)


# ---- after the COMMIT --------------------------------------------------------------------
# What a unit of work saved is told, after its COMMIT, to whoever listens: the API and the
# worker subscribe their counters and spans (api.create_app, worker/supervisor), so
# persistence imports no observer and a rolled-back change tells nobody.
SavedListener = Callable[[Changes], None]
_listeners: list[SavedListener] = []
_pending = threading.local()


def listen(listener: SavedListener) -> None:
    """Tell `listener` every Changes saved in this process, after its COMMIT (once per
    listener however often it subscribes)."""
    if listener not in _listeners:
        _listeners.append(listener)


@contextmanager
def after_commit() -> Iterator[None]:
    """Hold what `on_commit` is given until the block ends without an error (unit_of_work
    puts it outside the transaction, so that is after the COMMIT); a nested block leaves
    it to the outermost."""
    if getattr(_pending, "queue", None) is not None:
        yield
        return
    queue: list[Callable[[], None]] = []
    _pending.queue = queue
    try:
        yield
    finally:
        _pending.queue = None
    for later in queue:
        later()


def on_commit(later: Callable[[], None]) -> None:
    """Run `later` once the unit of work commits (at once outside one)."""
    queue = getattr(_pending, "queue", None)
    if queue is None:
        later()
    else:
        queue.append(later)


def _tell(changes: Changes) -> None:
    for listener in _listeners:
        listener(changes)


@contextmanager
def unit_of_work(
    conn: psycopg.Connection, woke: Callable[[], bool] | None = None
) -> Iterator[None]:
    """One pipelined transaction: BEGIN, the lock and the reads travel in one round trip,
    the writes and the COMMIT in another (save_run adds no sync of its own). What it saved
    is told to the listeners after the COMMIT, and after FLUSH_BARRIER when it committed
    without waiting for the disk (_commit_without_flush). The relays' NOTIFY_IF_PENDING
    follows the COMMIT unless `woke`, asked at the end, says no wake-up was written: a
    workflow that dispatches nothing pays no transaction for it (issue 41)."""

    def then() -> str | None:
        return NOTIFY_IF_PENDING if woke is None or woke() else None

    with after_commit():
        _pending.unflushed = False
        try:
            with pipelined_transaction(conn, then=then):
                yield
            unflushed = _pending.unflushed
        finally:
            _pending.unflushed = None
        if unflushed:
            conn.execute(FLUSH_BARRIER)


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
    conn: psycopg.Connection,
    execution_id: str,
    *,
    skip_locked: bool = False,
    open_items: bool = False,
    also: Sequence[str] = (),
) -> Run | None:
    """Lock an execution and load it (each step says whether its lease has run out); None
    when it does not exist or, with `skip_locked`, when another session holds it locked.

    With `open_items` (the worker's units of work), a map's settled items are not loaded
    (LOAD_OPEN_STEPS); `also` names rows to load whatever their status, with their
    items. The run loads the rest of a map itself when it needs it (Run.load_items).

    The reads are sent before any is fetched: in a unit of work's pipeline they travel
    in one round trip, and the server still runs the lock first."""
    with conn.cursor(row_factory=dict_row) as cur, conn.cursor(row_factory=dict_row) as steps:
        cur.execute(
            LOCK_EXECUTION_SKIP_LOCKED if skip_locked else LOCK_EXECUTION, {"id": execution_id}
        )
        if open_items:
            steps.execute(LOAD_OPEN_STEPS, {"id": execution_id, "also": list(also)})
        else:
            steps.execute(LOAD_STEPS, {"id": execution_id})
        # A freeze here, reads sent but not fetched, must leave no lock that no server
        # timeout covers (docs/contract.md#frozen-processes).
        faults.hit("after_reads_sent")
        head = cur.fetchone()
        if head is None:
            return None
        rows = steps.fetchall()
    settled: dict[str, set[str]] | None = None
    if open_items:
        settled = {}
        for row in rows:
            if row["type"] == SETTLED:
                settled.setdefault(row["step_id"], set()).add(row["status"])
        rows = [row for row in rows if row["type"] != SETTLED]
    run = _run(head, definition_for(conn, head["version_id"]), rows, str(execution_id))
    # Each kind of step the workflow has reads what it needs (domain/kinds/base.py): a
    # workflow without wait, map or workflow steps pays for none of their reads.
    loader = _Loader(conn, run.execution_id, settled, run.workflow)
    for step_type in dict.fromkeys(step.type for step in run.definition.steps):
        KINDS[step_type].load(run, loader)
    return run


def _run(head: dict[str, Any], definition: Definition, rows: list[dict[str, Any]], eid: str) -> Run:
    """A Run from its execution's row (LOCK_EXECUTION) and its step rows."""
    return Run(
        execution_id=eid,
        workflow=head["workflow"],
        version=head["version"],
        status=ExecutionStatus(head["status"]),
        input=head["input"],
        definition=definition,
        steps={row["step_id"]: StepState(**row) for row in rows},
        now=head["now"],
        cancel_requested=head["cancel_requested"],
        stop_reason=None if head["stop_reason"] is None else StopReason(head["stop_reason"]),
        workflow_id=head["workflow_id"],
        concurrency_key=head["concurrency_key"],
        held_slot=head["held_slot"],
        deadline_passed=head["deadline_passed"],
        expired=head["expired"],
        paused_from=None if head["paused_from"] is None else ExecutionStatus(head["paused_from"]),
        pause_reason=None if head["pause_reason"] is None else PauseReason(head["pause_reason"]),
        workflow_paused_by=head["workflow_paused_by"],
        traceparent=head["traceparent"],
        depth=head["depth"],
        parent=None if head["parent_id"] is None else (head["parent_id"], head["parent_step"]),
        root_id=head["root_id"],
    )


class _Loader:
    """What a step kind reads beside the steps, in the unit of work that loads its run
    (domain/kinds/base.Loader), on the locked transaction's connection."""

    def __init__(
        self,
        conn: psycopg.Connection,
        execution_id: str,
        settled: dict[str, set[str]] | None,
        workflow: str = "",
    ) -> None:
        self.conn, self.execution_id, self.settled = conn, execution_id, settled
        self.workflow = workflow

    def item_rows(self, map_id: str) -> list[StepState]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(LOAD_MAP_ROWS, {"id": self.execution_id, "prefix": f"{map_id}["})
            return [StepState(**row) for row in cur.fetchall()]

    def early_resumes(self) -> dict[str, Any]:
        resumes = self.conn.execute(PENDING_RESUMES, {"id": self.execution_id}).fetchall()
        return {step_id: body for step_id, body in resumes}

    def event_port(self) -> events.EventPort:
        return events.EventPort(self.conn, self.execution_id, self.workflow)

    def children(self) -> dict[str, ChildState]:
        return {
            step_id: ChildState(child_id, ExecutionStatus(status), output, error)
            for child_id, step_id, status, output, error in children.load_children(
                self.conn, self.execution_id
            )
        }

    def child_limits(self) -> tuple[int, int]:
        return children.max_child_depth(), children.max_descendants()

    def descendants(self, root_id: str) -> int:
        return children.descendants(self.conn, root_id)

    def child_targets(self, keys: tuple[str, ...]) -> dict[str, ChildTarget | None]:
        found: dict[str, ChildTarget | None] = dict.fromkeys(keys)
        for key, workflow_id, version_id, version in children.load_targets(self.conn, keys):
            found[key] = ChildTarget(
                workflow_id, version_id, version, definition_for(self.conn, version_id)
            )
        return found

    def new_execution_id(self) -> str:
        return str(uuid7())


def save_run(conn: psycopg.Connection, changes: Changes) -> bool:
    """Write what a unit of work changed (Run.take_changes), in the caller's transaction.
    Returns whether it may have written a wake-up (a dispatched step, a slot handed on, a
    child started, cancelled or its parent woken): only then need the relays hear of the
    commit (outbox.NOTIFY_IF_PENDING)."""
    eid = changes.execution_id
    # A step this unit of work changed is dispatched only if it is still ready; one it
    # did not change was ready when it was queued for dispatch (a resume re-dispatches
    # the ready steps of a paused execution without touching them).
    dispatch = [
        s
        for s in changes.dispatch
        if s not in changes.steps or changes.steps[s].status == StepStatus.READY
    ]
    created = set(changes.new_steps)
    params = {
        "execution_id": eid,
        "steps": _rows(
            _step_row(s, changes.leases.get(s.step_id))
            for s in changes.steps.values()
            if s.step_id not in created
        ),
        "new_steps": _rows(
            {**_step_row(changes.steps[step_id], None), "type": changes.steps[step_id].type}
            for step_id in changes.new_steps
        ),
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
    failure = recorded(changes)
    if failure is None:
        conn.execute(SAVE_RUN, params)
    else:
        saved = conn.execute(SAVE_RUN_FAILING, params | failures.upsert_params(failure))
        if _listeners:
            # Read once the pipeline has its results (after the COMMIT), not before it.
            on_commit(functools.partial(_opened, saved, changes))
    if _listeners:
        on_commit(functools.partial(_tell, changes))
    faults.hit("after_writes_sent")  # a freeze here must not leave the writes' locks either
    if changes.released_slot is not None:
        # The slot this execution held is free: the next of its key starts in this same
        # transaction (lock order: this execution's row, then the key's slot lock).
        flowcontrol.hand_on(conn, *changes.released_slot)
        _commit_without_flush(conn)
    _save_children(conn, changes)
    if changes.event_waits or changes.consumed_events:
        events.save(conn, changes)
    return bool(
        dispatch
        or changes.released_slot is not None
        or changes.child_starts
        or changes.child_cancels
        or changes.wake_parent is not None
    )


def _opened(saved: psycopg.Cursor[Any], changes: Changes) -> None:
    """Whether SAVE_RUN_FAILING opened its failure group, for the listeners (metrics)."""
    row = saved.fetchone()
    changes.failure_group_opened = bool(row and row[1])


def _commit_without_flush(conn: psycopg.Connection) -> None:
    """In a unit of work that holds a key's SLOT_LOCK: commit without waiting for the disk;
    unit_of_work makes the commit durable with db.FLUSH_BARRIER before it returns (the
    executor acks its wake-up after that), as flowcontrol.create does for the intake, so
    the next intake or end of the key does not wait for this commit's WAL flush. Outside a
    unit of work the commit waits for the disk as configured."""
    if getattr(_pending, "unflushed", None) is False:
        conn.execute(COMMIT_WITHOUT_FLUSH)
        _pending.unflushed = True


def _save_children(conn: psycopg.Connection, changes: Changes) -> None:
    """docs/contract.md#child-workflows, in the unit of work's transaction: the children its
    workflow steps started, the children of its cancelled workflow steps (lock order: this
    execution, then its child; a child never locks its parent), and the parent's wake-up when this
    child ended."""
    if changes.child_starts:
        children.start(conn, changes.execution_id, changes.child_starts, flowcontrol.admit_child)
        faults.hit("after_child_created")  # a kill here rolls back the child and the step
        # A kill here leaves both: the step waits for the child it made.
        on_commit(lambda: faults.hit("after_child_committed"))
    for child_id in changes.child_cancels:
        child = load_run(conn, child_id, skip_locked=True)
        if child is None:
            children.record_cancel(conn, child_id)
        elif not child.terminal and not child.cancel_requested:
            child.cancel(actor=PARENT_CANCEL_ACTOR)
            save_run(conn, child.take_changes())
    if changes.wake_parent is not None:
        children.wake_parent(conn, changes.wake_parent)


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
