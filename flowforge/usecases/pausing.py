"""Pausing and resuming a whole workflow (docs/contract.md#pause).

A paused workflow still accepts webhooks (202): they queue, and `max_queued` and
`start_within_s` keep applying. Nothing of it starts or continues: its live executions
are paused one unit of work each (the engine's `pause`, with the operator as actor), and
one that arrives or is touched later is paused by the first worker that takes it up
(Run.hold, with the same actor); no concurrency slot is handed out (FILL_SLOTS). Resume
clears the flag, then resumes its paused executions oldest first — their wake-ups are
written in arrival order — and hands the free slots to each key's queue, oldest first.

Resume `onto` a version (docs/howto/morning-after-an-outage.md) first re-pins, while the
workflow is still paused, each execution that never started a step — the ones that
arrived during the outage, pinned to the broken version — onto that version: its steps
are written afresh from the target's definition, so no second bulk replay is needed. One
whose concurrency key would change under the target keeps its version (its slot or its
place in a queue belongs to the old key).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb

from flowforge.domain.model import EventKind, ExecutionStatus, PauseReason, StepStatus, sql_list
from flowforge.errors import ClientError, Conflict, NotFound
from flowforge.store import flowcontrol
from flowforge.store.db import notify_relay
from flowforge.store.outbox import INSERT_WAKEUPS
from flowforge.store.runs import definition_for, load_run, save_run, unit_of_work
from flowforge.usecases import intake

# What `onto` names: a version number, or the newest.
Onto = int | Literal["latest"]
# workflow_versions.version is an integer column: a larger number names no version.
MAX_VERSION = 2**31 - 1

# Set or clear the flag; the previous value says whether anything changed.
SET_PAUSED = """
UPDATE workflows w SET paused_at = coalesce(w.paused_at, now()),
       paused_by = CASE WHEN w.paused_at IS NULL THEN %(actor)s ELSE w.paused_by END
FROM workflows old WHERE old.id = w.id AND w.key = %(key)s AND w.archived_at IS NULL
RETURNING w.id, old.paused_at IS NULL
"""
CLEAR_PAUSED = """
UPDATE workflows w SET paused_at = NULL, paused_by = NULL
FROM workflows old WHERE old.id = w.id AND w.key = %(key)s AND w.archived_at IS NULL
RETURNING w.id, old.paused_at IS NOT NULL
"""
# The workflow's live executions a pause holds at once, oldest first. One waiting in a
# key's queue for a slot stays `queued` (it is counted by max_queued and expires as
# before); it starts only when resume hands it a slot.
HELD = (ExecutionStatus.QUEUED, ExecutionStatus.RUNNING, ExecutionStatus.WAITING)
LIVE = f"""
SELECT id FROM executions
WHERE workflow_id = %(workflow_id)s AND status IN {sql_list(HELD)}
  AND cancel_requested_at IS NULL AND NOT ({flowcontrol.IN_QUEUE})
ORDER BY created_at, id
"""
PAUSED_BY_WORKFLOW = """
SELECT id FROM executions
WHERE workflow_id = %(workflow_id)s AND status = 'paused' AND pause_reason = 'workflow'
ORDER BY created_at, id
"""
# Re-pinning (resume onto a version). The workflow, paused, with its target version.
PAUSED_TARGET = """
SELECT w.id, w.paused_at IS NOT NULL, v.id, v.version
FROM workflows w
LEFT JOIN workflow_versions v ON v.workflow_id = w.id
     AND v.version = CASE WHEN %(version)s::int IS NULL THEN w.latest_version
                          ELSE %(version)s END
WHERE w.key = %(key)s AND w.archived_at IS NULL
"""
# An execution that never started a step: queued, or held by the workflow's pause, every
# step still pending or ready with no try used. `id` narrows it to one, locked.
NOT_STARTED = (StepStatus.PENDING, StepStatus.READY)
NEVER_STARTED = f"""
SELECT e.id, e.input, e.concurrency_key, v.version,
       EXISTS (SELECT 1 FROM steps s WHERE s.execution_id = e.id AND s.status = 'ready')
FROM executions e JOIN workflow_versions v ON v.id = e.version_id
WHERE e.workflow_id = %(workflow_id)s AND e.version_id <> %(version_id)s
  AND (e.status = 'queued' OR (e.status = 'paused' AND e.pause_reason = 'workflow'))
  AND e.cancel_requested_at IS NULL
  AND (%(id)s::uuid IS NULL OR e.id = %(id)s)
  AND NOT EXISTS (
      SELECT 1 FROM steps s WHERE s.execution_id = e.id
        AND (s.status NOT IN {sql_list(NOT_STARTED)} OR s.attempts > 0
             OR s.started_at IS NOT NULL))
ORDER BY e.created_at, e.id
"""
REPIN_EXECUTION = """
UPDATE executions SET version_id = %(version_id)s, priority = %(priority)s,
       deadline_at = created_at + make_interval(secs => %(deadline_s)s::float8),
       updated_at = now()
WHERE id = %(id)s
"""
DROP_STEPS = "DELETE FROM steps WHERE execution_id = %(id)s"
# The target's steps as a new execution has them: roots ready when the execution's were
# (it was not waiting in a key's queue), the others pending.
REPIN_STEPS = """
INSERT INTO steps (execution_id, step_id, type, position, status, ready_at, ready_since,
                   priority)
SELECT %(id)s, s.step_id, s.type, s.position,
       CASE WHEN s.root AND %(ready)s THEN 'ready' ELSE 'pending' END,
       CASE WHEN s.root AND %(ready)s THEN now() END,
       CASE WHEN s.root AND %(ready)s THEN now() END, %(priority)s
FROM unnest(%(step_ids)s::text[], %(types)s::text[], %(roots)s::bool[])
     WITH ORDINALITY AS s(step_id, type, root, position)
"""
REPIN_RECORD = """
INSERT INTO execution_events (execution_id, kind, detail) VALUES (%(id)s, %(kind)s, %(detail)s)
"""
# A queued one no worker took up yet: its roots' wake-ups (a paused one gets them when it
# is resumed).
REPIN_WAKEUPS = f"""
{INSERT_WAKEUPS} SELECT execution_id, step_id FROM steps
WHERE execution_id = %(id)s AND status = 'ready'
  AND EXISTS (SELECT 1 FROM executions WHERE id = %(id)s AND status = 'queued')
"""

QUEUED_KEYS = f"""
SELECT DISTINCT concurrency_key FROM executions
WHERE workflow_id = %(workflow_id)s AND {flowcontrol.IN_QUEUE}
"""


def pause_workflow(conn: psycopg.Connection, key: str, *, actor: dict[str, Any]) -> dict[str, Any]:
    """Pause a workflow and hold its live executions; returns {paused, changed, held}."""
    with conn.transaction():
        row = conn.execute(SET_PAUSED, {"key": key, "actor": Jsonb(actor)}).fetchone()
    if row is None:
        raise NotFound(f"workflow {key!r} does not exist")
    workflow_id, changed = row
    held = 0
    for (execution_id,) in conn.execute(LIVE, {"workflow_id": workflow_id}).fetchall():
        with unit_of_work(conn):
            run = load_run(conn, str(execution_id))
            if run is None or run.paused or run.terminal or run.cancel_requested:
                continue
            if run.workflow_paused_by is None:
                break  # resumed meanwhile: leave the rest alone
            run.pause(PauseReason.WORKFLOW, actor=actor)
            save_run(conn, run.take_changes())
            held += 1
    return {"paused": True, "changed": bool(changed), "held": held}


class InvalidOnto(ClientError):
    """`onto` names no version of the workflow (422)."""

    status = 422
    title = "Invalid version"

    def __init__(self, message: str, errors: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.errors = errors


def repin(
    conn: psycopg.Connection, key: str, onto: Onto, *, actor: dict[str, Any]
) -> dict[str, Any]:
    """Re-pin the paused workflow's executions that never started a step onto version
    `onto`, oldest first, each in its own unit of work under its row lock (a worker that
    takes one up meanwhile finds the workflow paused and starts nothing); returns
    {onto, repinned, kept}. A workflow that is not paused is refused (409): a worker
    could start any of them while it runs."""
    version = None if onto == "latest" else int(onto)
    if version is not None and not 1 <= version <= MAX_VERSION:
        raise InvalidOnto(
            f"workflow {key!r} has no version {version}",
            [{"path": "$.onto", "message": "no such version"}],
        )
    row = conn.execute(PAUSED_TARGET, {"key": key, "version": version}).fetchone()
    if row is None:
        raise NotFound(f"workflow {key!r} does not exist")
    workflow_id, paused, version_id, number = row
    if version_id is None:
        raise InvalidOnto(
            f"workflow {key!r} has no version {version}",
            [{"path": "$.onto", "message": "no such version"}],
        )
    if not paused:
        raise Conflict(
            f"workflow {key!r} is not paused: re-pinning onto a version happens while it is "
            "(pause it, publish the fix, then resume onto it)"
        )
    target = definition_for(conn, version_id)
    ids = [step.id for step in target.steps]
    found = {"workflow_id": workflow_id, "version_id": version_id, "id": None}
    repinned, kept = 0, 0
    for candidate in conn.execute(NEVER_STARTED, found).fetchall():
        with unit_of_work(conn):
            locked = conn.execute(
                NEVER_STARTED + " FOR UPDATE OF e", {**found, "id": candidate[0]}
            ).fetchone()
            if locked is None:
                continue  # started, cancelled or re-pinned meanwhile
            execution_id, document, ckey, was, ready = locked
            body = json.dumps(document).encode()
            if flowcontrol.concurrency_key(target, body) != ckey:
                kept += 1
                continue
            params = {
                "id": execution_id,
                "version_id": version_id,
                "priority": intake.priority_params(target, body)["priority"],
                "deadline_s": target.deadline_s,
                "ready": ready,
                "step_ids": ids,
                "types": [str(step.type) for step in target.steps],
                "roots": [not step.depends_on for step in target.steps],
                "kind": EventKind.EXECUTION_REPINNED.value,
                "detail": Jsonb({"from_version": was, "version": number, "actor": dict(actor)}),
            }
            conn.execute(REPIN_EXECUTION, params)
            conn.execute(DROP_STEPS, params)
            conn.execute(REPIN_STEPS, params)
            conn.execute(REPIN_RECORD, params)
            conn.execute(REPIN_WAKEUPS, params)
            repinned += 1
    return {"onto": number, "repinned": repinned, "kept": kept}


def resume_workflow(
    conn: psycopg.Connection, key: str, *, actor: dict[str, Any], onto: Onto | None = None
) -> dict[str, Any]:
    """Resume a workflow: its paused executions in arrival order, then its queues through
    flow control; returns {paused, changed, resumed, started}, with {onto, repinned, kept}
    when `onto` re-pinned its never-started executions first."""
    repinned = repin(conn, key, onto, actor=actor) if onto is not None else {}
    with conn.transaction():
        row = conn.execute(CLEAR_PAUSED, {"key": key}).fetchone()
    if row is None:
        raise NotFound(f"workflow {key!r} does not exist")
    workflow_id, changed = row
    resumed = 0
    params = {"workflow_id": workflow_id}
    for (execution_id,) in conn.execute(PAUSED_BY_WORKFLOW, params).fetchall():
        with unit_of_work(conn):
            run = load_run(conn, str(execution_id))
            if run is None or run.pause_reason != PauseReason.WORKFLOW:
                continue
            if run.workflow_paused_by is not None:
                break  # paused again meanwhile
            run.unpause(actor=actor)
            save_run(conn, run.take_changes())
            if run.status == ExecutionStatus.QUEUED and run.concurrency_key is not None:
                flowcontrol.fill_slots(conn, run.workflow_id, run.concurrency_key)
            resumed += 1
    started = 0
    for (ckey,) in conn.execute(QUEUED_KEYS, params).fetchall():
        with conn.transaction():
            started += flowcontrol.fill_slots(conn, workflow_id, ckey)
    if started:
        notify_relay(conn)
    return {
        "paused": False,
        "changed": bool(changed),
        "resumed": resumed,
        "started": started,
        **repinned,
    }
