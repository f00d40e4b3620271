"""Pausing and resuming a whole workflow (docs/contract.md#pause).

A paused workflow still accepts webhooks (202): they queue, and `max_queued` and
`start_within_s` keep applying. Nothing of it starts or continues: its live executions
are paused one unit of work each (the engine's `pause`, with the operator as actor), and
one that arrives or is touched later is paused by the first worker that takes it up
(Run.hold, with the same actor); no concurrency slot is handed out (FILL_SLOTS). Resume
clears the flag, then resumes its paused executions oldest first — their wake-ups are
written in arrival order — and hands the free slots to each key's queue, oldest first.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from flowforge.domain.model import ExecutionStatus, PauseReason
from flowforge.errors import NotFound
from flowforge.store import flowcontrol
from flowforge.store.db import notify_relay
from flowforge.store.runs import load_run, save_run, unit_of_work

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
LIVE = f"""
SELECT id FROM executions
WHERE workflow_id = %(workflow_id)s AND status IN ('queued', 'running', 'waiting')
  AND cancel_requested_at IS NULL AND NOT ({flowcontrol.IN_QUEUE})
ORDER BY created_at, id
"""
PAUSED_BY_WORKFLOW = """
SELECT id FROM executions
WHERE workflow_id = %(workflow_id)s AND status = 'paused' AND pause_reason = 'workflow'
ORDER BY created_at, id
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


def resume_workflow(conn: psycopg.Connection, key: str, *, actor: dict[str, Any]) -> dict[str, Any]:
    """Resume a workflow: its paused executions in arrival order, then its queues through
    flow control; returns {paused, changed, resumed, started}."""
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
    return {"paused": False, "changed": bool(changed), "resumed": resumed, "started": started}
