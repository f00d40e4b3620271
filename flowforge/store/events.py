"""Events correlated by a business key (docs/contract.md#events): their statements, the
port a wait opening in a unit of work reads them through, and what a unit of work saves
of them. The use case that receives an event and offers it to its waits is
usecases/events.py.

Lock order: a sender takes the (name, key) advisory lock alone, in the short transaction
that records the event; a wait opening takes it under its execution's row lock, to look
for an event kept from before and register itself. Each side so sees the other's commit,
and no transaction holds the advisory lock while it waits for an execution's row.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import Jsonb

if TYPE_CHECKING:
    from flowforge.domain.changes import Changes
    from flowforge.domain.definitions import EventWait

API_SENDER = "api"
DEFAULT_LOOKBACK_S = 86_400.0

# One (name, key) at a time between a sender recording an event and a wait opening: names
# hold no space (domain/definitions/bounds.EVENT_NAME_PATTERN), so the text is unambiguous.
LOCK_NAME_KEY = """
SELECT pg_advisory_xact_lock(hashtextextended(%(name)s || ' ' || %(key)s, 61))
"""
INSERT_EVENT = """
INSERT INTO events (sender, name, key, delivery_id, payload, body_sha256, audience, expires_at)
VALUES (%(sender)s, %(name)s, %(key)s, %(delivery_id)s, %(payload)s, %(sha)s, %(audience)s,
        now() + make_interval(secs => %(lookback_s)s))
ON CONFLICT (sender, name, delivery_id) DO NOTHING
RETURNING id::text
"""
# A redelivery: the event already recorded under this identity.
FIND_EVENT = """
SELECT id::text, key, body_sha256, audience, fanned_out_at IS NOT NULL AS fanned_out
FROM events WHERE sender = %(sender)s AND name = %(name)s AND delivery_id = %(delivery_id)s
"""
# The waits an event is offered to: its name and key, its sender, its audience.
MATCHING_WAITS = """
SELECT w.execution_id::text, w.step_id FROM event_waits w
WHERE w.name = %(name)s AND w.key = %(key)s AND w.sender = %(sender)s
  AND (%(audience)s::text[] IS NULL OR w.workflow = ANY(%(audience)s::text[]))
ORDER BY w.execution_id, w.step_id
"""
LOAD_EVENT = "SELECT payload FROM events WHERE id = %(id)s"
FANNED_OUT = "UPDATE events SET fanned_out_at = now() WHERE id = %(id)s"
DROP_WAIT = (
    "DELETE FROM event_waits WHERE execution_id = %(execution_id)s AND step_id = %(step_id)s"
)
CONSUMED = """
SELECT 1 FROM event_consumptions
WHERE event_id = %(event_id)s AND execution_id = %(execution_id)s AND step_id = %(step_id)s
"""
# The oldest event a wait opening now may take: kept within its lookback (or still being
# offered: its sender recorded it before this transaction saw it, and may have looked for
# waits before this one registered), of its sender, for its workflow, not taken by this
# step before.
EARLY_EVENT = """
SELECT e.id::text, e.payload FROM events e
WHERE e.name = %(name)s AND e.key = %(key)s AND e.sender = %(sender)s
  AND (e.received_at >= now() - make_interval(secs => %(lookback_s)s)
       OR e.fanned_out_at IS NULL)
  AND e.expires_at > now()
  AND (e.audience IS NULL OR %(workflow)s = ANY(e.audience))
  AND NOT EXISTS (
      SELECT 1 FROM event_consumptions c
      WHERE c.event_id = e.id AND c.execution_id = %(execution_id)s AND c.step_id = %(step_id)s)
ORDER BY e.received_at, e.id
LIMIT 1
"""
# What a unit of work changed (Changes.event_waits, Changes.consumed_events).
SAVE_EVENT_WAITS = """
INSERT INTO event_waits (execution_id, step_id, workflow, sender, name, key)
SELECT %(execution_id)s, w->>0, w2.key, w->>3, w->>1, w->>2
FROM jsonb_array_elements(%(waits)s) AS w
CROSS JOIN (SELECT wf.key FROM executions e JOIN workflows wf ON wf.id = e.workflow_id
            WHERE e.id = %(execution_id)s) AS w2
ON CONFLICT (execution_id, step_id) DO UPDATE
SET sender = EXCLUDED.sender, name = EXCLUDED.name, key = EXCLUDED.key, opened_at = now()
"""
SAVE_CONSUMED = """
WITH taken AS (
    INSERT INTO event_consumptions (event_id, execution_id, step_id)
    SELECT (c->>0)::uuid, %(execution_id)s, c->>1 FROM jsonb_array_elements(%(consumed)s) AS c
    ON CONFLICT DO NOTHING
)
DELETE FROM event_waits
WHERE execution_id = %(execution_id)s
  AND step_id IN (SELECT c->>1 FROM jsonb_array_elements(%(consumed)s) AS c)
"""
# GET /api/v1/events: newest first, a page after a cursor (received_at, id).
LIST_EVENTS = """
SELECT e.id::text, e.sender, e.name, e.key, e.delivery_id, e.payload, e.received_at,
       e.expires_at, (SELECT count(*) FROM event_consumptions c WHERE c.event_id = e.id)
FROM events e
WHERE (%(name)s::text IS NULL OR e.name = %(name)s)
  AND (%(key)s::text IS NULL OR e.key = %(key)s)
  AND (%(scope)s::text[] IS NULL OR e.audience && %(scope)s::text[]
       OR e.sender = ANY(%(senders)s::text[]))
  AND e.expires_at > now()
ORDER BY e.received_at DESC, e.id DESC
LIMIT %(limit)s
"""
# The housekeeping: expired events, their consumptions with them (ON DELETE CASCADE).
EXPIRE_EVENTS = """
DELETE FROM events WHERE id IN (
    SELECT id FROM events WHERE expires_at <= now() LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""


def lookback_s() -> float:
    """FLOWFORGE_EVENT_LOOKBACK_S, how long an event is kept (config.Settings documents it)."""
    raw = os.environ.get("FLOWFORGE_EVENT_LOOKBACK_S", "").strip()
    if not raw:
        return DEFAULT_LOOKBACK_S
    value = float(raw)
    if value <= 0:
        raise ValueError("FLOWFORGE_EVENT_LOOKBACK_S must be positive")
    return value


def wait_sender(wait: EventWait) -> str:
    """The sender a wait takes events from: the API, or a workflow's verified deliveries."""
    return API_SENDER if wait.sender is None else workflow_sender(wait.sender)


def workflow_sender(workflow_key: str) -> str:
    """The sender of the events a workflow's deliveries emit."""
    return f"workflow:{workflow_key}"


class EventPort:
    """domain/event_waits.EventPort over a unit of work's locked connection."""

    def __init__(self, conn: psycopg.Connection, execution_id: str, workflow: str) -> None:
        self.conn, self.execution_id, self.workflow = conn, execution_id, workflow

    def early_event(
        self, step_id: str, wait: EventWait, key: str, lookback: float | None
    ) -> tuple[str, Any] | None:
        """Serialise with this (name, key)'s senders, then take the oldest kept event."""
        kept = lookback_s()
        window = kept if wait.lookback_s is None else min(wait.lookback_s, kept)
        self.conn.execute(LOCK_NAME_KEY, {"name": wait.name, "key": key})
        row = self.conn.execute(
            EARLY_EVENT,
            {
                "name": wait.name,
                "key": key,
                "sender": wait_sender(wait),
                "lookback_s": window if lookback is None else lookback,
                "workflow": self.workflow,
                "execution_id": self.execution_id,
                "step_id": step_id,
            },
        ).fetchone()
        return None if row is None else (row[0], row[1])


def save(conn: psycopg.Connection, changes: Changes) -> None:
    """Write the event waits a unit of work opened and the events its steps took; called
    by runs.save_run only when there are any."""
    eid = changes.execution_id
    if changes.event_waits:
        waits = [
            [step_id, name, key, API_SENDER if sender is None else workflow_sender(sender)]
            for step_id, name, key, sender in changes.event_waits
        ]
        conn.execute(SAVE_EVENT_WAITS, {"execution_id": eid, "waits": Jsonb(waits)})
    if changes.consumed_events:
        consumed = [list(pair) for pair in changes.consumed_events]
        conn.execute(SAVE_CONSUMED, {"execution_id": eid, "consumed": Jsonb(consumed)})


def listed(
    conn: psycopg.Connection,
    name: str | None,
    key: str | None,
    scope: list[str] | None,
    limit: int,
) -> list[dict[str, Any]]:
    """GET /api/v1/events: the events kept, newest first (a scoped key: those its
    workflows may take, or emitted)."""
    rows = conn.execute(
        LIST_EVENTS,
        {
            "name": name,
            "key": key,
            "scope": scope,
            "senders": None if scope is None else [workflow_sender(w) for w in scope],
            "limit": limit,
        },
    ).fetchall()
    fields = ("id", "sender", "name", "key", "delivery_id", "payload")
    return [
        {
            **dict(zip(fields, row[:6], strict=True)),
            "received_at": row[6].isoformat(),
            "expires_at": row[7].isoformat(),
            "consumed_by": row[8],
        }
        for row in rows
    ]
