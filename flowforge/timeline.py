"""Read models of executions for the API and the CLI: one execution in full, or a page."""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from flowforge import attention
from flowforge.errors import ClientError, NotFound
from flowforge.model import ExecutionStatus
from flowforge.search import uuid_floor

EXECUTION = """
SELECT e.id, w.key AS workflow, v.version, e.status, e.input, e.trigger, e.idempotency_key,
       e.created_at, e.started_at, e.finished_at, e.updated_at, e.cancel_requested_at
FROM executions e
JOIN workflows w ON w.id = e.workflow_id
JOIN workflow_versions v ON v.id = e.version_id
WHERE e.id = %(id)s
"""
STEPS = """
SELECT step_id, type, status, attempts, wake_at, output, error, started_at, finished_at,
       lease_owner, lease_expires_at
FROM steps WHERE execution_id = %(id)s ORDER BY position
"""
ATTEMPTS = """
SELECT step_id, attempt, worker, started_at, finished_at, outcome, error, http_status, duration_ms,
       request, response
FROM attempts WHERE execution_id = %(id)s ORDER BY id
"""
EVENTS = """
SELECT at, step_id, kind, detail FROM execution_events WHERE execution_id = %(id)s ORDER BY id
"""
# Keyset pagination, newest first, on the primary key: execution ids are UUIDv7, ordered
# by creation time; the cursor is the last row's id.
PAGE = """
SELECT e.id, w.key AS workflow, v.version, e.status, e.created_at, e.started_at,
       e.finished_at
FROM executions e
JOIN workflows w ON w.id = e.workflow_id
JOIN workflow_versions v ON v.id = e.version_id
WHERE (%(workflow)s::text IS NULL OR w.key = %(workflow)s)
  AND (%(workflows)s::text[] IS NULL OR w.key = ANY(%(workflows)s))
  AND (%(status)s::text IS NULL OR e.status = %(status)s)
  AND (%(after)s::uuid IS NULL OR e.id < %(after)s)
  AND (%(since)s::uuid IS NULL OR e.id >= %(since)s)
  AND (%(until)s::uuid IS NULL OR e.id < %(until)s)
ORDER BY e.id DESC
LIMIT %(limit)s
"""
# `needs_attention` means "has a step whose outcome is unknown", whatever the execution's
# own status: a cancelled execution can keep one, and an operator must still find it. The
# partial index steps_unknown holds only such steps (every needs_attention execution has
# one), so this never scans the steps table.
NEEDS_ATTENTION_PAGE = f"""
SELECT e.id, w.key AS workflow, v.version, e.status, e.created_at, e.started_at,
       e.finished_at
FROM executions e
JOIN workflows w ON w.id = e.workflow_id
JOIN workflow_versions v ON v.id = e.version_id
WHERE e.id IN (SELECT n.execution_id FROM ({attention.NEEDING_OPERATOR}) n
               WHERE %(after)s::uuid IS NULL OR n.execution_id < %(after)s)
  AND (%(since)s::uuid IS NULL OR e.id >= %(since)s)
  AND (%(until)s::uuid IS NULL OR e.id < %(until)s)
  AND (%(workflow)s::text IS NULL OR w.key = %(workflow)s)
  AND (%(workflows)s::text[] IS NULL OR w.key = ANY(%(workflows)s))
ORDER BY e.id DESC
LIMIT %(limit)s
"""
WORKFLOW_OF = """
SELECT w.key FROM executions e JOIN workflows w ON w.id = e.workflow_id WHERE e.id = %(id)s
"""


class BadCursor(ClientError):
    """The pagination cursor was not one this API handed out."""

    title = "Invalid cursor"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def workflow_of(conn: psycopg.Connection, execution_id: str) -> str:
    """The workflow key an execution belongs to (for API key scopes)."""
    row = conn.execute(WORKFLOW_OF, {"id": execution_id}).fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} does not exist")
    return row[0]


def execution_detail(conn: psycopg.Connection, execution_id: str) -> dict[str, Any]:
    """The execution with its steps, every attempt, and its event history."""
    with conn.cursor(row_factory=dict_row) as cur:
        head = cur.execute(EXECUTION, {"id": execution_id}).fetchone()
        if head is None:
            raise NotFound(f"execution {execution_id} does not exist")
        steps = cur.execute(STEPS, {"id": execution_id}).fetchall()
        attempts = cur.execute(ATTEMPTS, {"id": execution_id}).fetchall()
        events = cur.execute(EVENTS, {"id": execution_id}).fetchall()
    by_step: dict[str, list[dict[str, Any]]] = {}
    for a in attempts:
        by_step.setdefault(a["step_id"], []).append(
            {
                "attempt": a["attempt"],
                "worker": a["worker"],
                "started_at": _iso(a["started_at"]),
                "finished_at": _iso(a["finished_at"]),
                "outcome": a["outcome"],
                "error": a["error"],
                "http_status": a["http_status"],
                "duration_ms": a["duration_ms"],
                "request": a["request"],
                "response": a["response"],
            }
        )
    skipped_because = {
        e["step_id"]: (e["detail"] or {}).get("reason")
        for e in events
        if e["kind"] == "step.skipped"
    }
    return {
        "id": str(head["id"]),
        "workflow": head["workflow"],
        "version": head["version"],
        "status": head["status"],
        "trigger": head["trigger"],
        "idempotency_key": head["idempotency_key"],
        "input": head["input"],
        "created_at": _iso(head["created_at"]),
        "started_at": _iso(head["started_at"]),
        "finished_at": _iso(head["finished_at"]),
        "updated_at": _iso(head["updated_at"]),
        "cancel_requested_at": _iso(head["cancel_requested_at"]),
        "steps": [
            {
                "id": s["step_id"],
                "type": s["type"],
                "status": s["status"],
                "attempt_count": s["attempts"],
                "wake_at": _iso(s["wake_at"]),
                "lease_owner": s["lease_owner"],
                "lease_expires_at": _iso(s["lease_expires_at"]),
                "started_at": _iso(s["started_at"]),
                "finished_at": _iso(s["finished_at"]),
                "output": s["output"],
                "error": s["error"],
                "skipped_because": skipped_because.get(s["step_id"]),
                "attempts": by_step.get(s["step_id"], []),
            }
            for s in steps
        ],
        "events": [
            {"at": _iso(e["at"]), "step": e["step_id"], "kind": e["kind"], "detail": e["detail"]}
            for e in events
        ],
    }


def list_executions(
    conn: psycopg.Connection,
    *,
    workflow: str | None,
    workflows: tuple[str, ...] | None,
    status: str | None,
    limit: int,
    cursor: str | None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> dict[str, Any]:
    """One page of executions, newest first, and the cursor of the next page.

    `status="needs_attention"` lists every execution that needs an operator
    (flowforge/attention.py). `since`/`until` bound the creation time (at or after, before):
    ids are UUIDv7, so a time range is an id range on the primary key.
    """
    after = decode_cursor(cursor) if cursor else None
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            NEEDS_ATTENTION_PAGE if status == ExecutionStatus.NEEDS_ATTENTION else PAGE,
            {
                "workflow": workflow,
                "workflows": list(workflows) if workflows is not None else None,
                "status": status,
                "after": after,
                "since": uuid_floor(since) if since else None,
                "until": uuid_floor(until) if until else None,
                "limit": limit,
            },
        ).fetchall()
    items = [
        {
            "id": str(r["id"]),
            "workflow": r["workflow"],
            "version": r["version"],
            "status": r["status"],
            "created_at": _iso(r["created_at"]),
            "started_at": _iso(r["started_at"]),
            "finished_at": _iso(r["finished_at"]),
        }
        for r in rows
    ]
    next_cursor = None
    if len(rows) == limit:
        last = rows[-1]
        next_cursor = encode_cursor(str(last["id"]))
    return {"items": items, "next_cursor": next_cursor}


def encode_cursor(execution_id: str) -> str:
    """An opaque cursor: clients pass it back, never build it."""
    return base64.urlsafe_b64encode(uuid.UUID(execution_id).bytes).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The execution id a cursor stands for; BadCursor when it was tampered with."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return str(uuid.UUID(bytes=raw))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise BadCursor("pass back a next_cursor this API returned") from exc
