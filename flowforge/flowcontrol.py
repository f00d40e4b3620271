"""Concurrency slots and queue backpressure (SPEC §8), as SQL over execution rows.

There is no counter. An execution holds a slot of its (workflow, concurrency key) from
`slot_at` until it is terminal or asked to stop; a queued execution without `slot_at`
waits in its key's queue. Every statement that hands out slots — the intake, the
transaction that frees one, the reconciler — first takes the key's transaction-level
advisory lock (SLOT_LOCK) and then counts holders in a statement that starts after the
lock was granted, so under READ COMMITTED it sees every slot handed out before. A crash
anywhere leaves rows that are true: no slot can leak or be handed out twice.

Lock order: an execution row (when the caller holds one), then QUEUE_LOCK (intake of a
workflow with `max_queued` only), then SLOT_LOCK; queued rows are taken with SKIP
LOCKED. Nothing that holds SLOT_LOCK waits for an execution row, so no two writers can
deadlock. Fairness across keys follows from one queue and one set of slots per key.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

import psycopg

from flowforge import archive
from flowforge.db import notify_relay, one
from flowforge.definitions import Definition
from flowforge.errors import ClientError, Conflict
from flowforge.model import (
    EventKind,
    ExecutionStatus,
    StepStatus,
    execution_event,
    step_event,
    transition,
)
from flowforge.outbox import INSERT_WAKEUPS, NOTIFY
from flowforge.templating import TemplateError, render

logger = logging.getLogger(__name__)

# What the set-based statements below write are the engine's words (model.py), the same a
# Run would produce: a dropped execution `queued -> cancelled` with reason `concurrency`,
# its steps `cancelled`; a started one's roots `pending -> ready`.
_QUEUED, _CANCELLED = ExecutionStatus.QUEUED.value, ExecutionStatus.CANCELLED.value
_PENDING, _READY = StepStatus.PENDING.value, StepStatus.READY.value
_STEP_CANCELLED = StepStatus.CANCELLED.value
_DROPPED_KIND = execution_event(ExecutionStatus.CANCELLED)
_DROPPED = json.dumps({**transition(_QUEUED, _CANCELLED), "reason": "concurrency"})
_READY_KIND = step_event(StepStatus.READY)
_MADE_READY = json.dumps(transition(_PENDING, _READY))

# The concurrency key of a schedule's ticks (SPEC §9): overlap `skip`, `buffer_one` and
# `cancel_other` are a limit of 1 on it, with on_full `skip` (nothing written), `buffer_one`
# (queue at most one) and `cancel_oldest`. No rendered key may take it (concurrency_key).
SCHEDULE_KEY = "@schedule"
# The slot limit of an execution `e` pinning version `v`: 1 for schedule ticks.
KEY_LIMIT = (
    f"CASE WHEN e.concurrency_key = '{SCHEDULE_KEY}' THEN 1"
    " ELSE (v.definition->'concurrency'->>'limit')::int END"
)
# Keys are stored and shown; a bounded length keeps index entries small.
MAX_KEY_CHARS = 255
# Retry-After of a refused webhook, in seconds, when nothing started in the last minute.
IDLE_RETRY_AFTER_S = 60

# Predicates over one `executions` row (unqualified: used inside single-table subqueries).
HOLDS_SLOT = (
    "slot_at IS NOT NULL AND cancel_requested_at IS NULL"
    " AND status IN ('queued', 'running', 'waiting', 'paused', 'needs_attention')"
)
IN_QUEUE = "slot_at IS NULL AND concurrency_key IS NOT NULL AND status = 'queued'"

# The key's slot lock, held to the end of the transaction.
SLOT_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtextextended(%(workflow_id)s::text || '/' || %(ckey)s, 0))"
)
# The workflow's queue lock: makes the max_queued count exact across keys and API processes.
QUEUE_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%(workflow_id)s::text, 8))"

# The intake's target is still what the per-process cache says: the version is the newest
# and the signing secret that matched is not revoked. Shared by both intake statements.
STILL_CURRENT = """SELECT 1 FROM workflows w
    WHERE w.id = %(workflow_id)s AND w.latest_version = %(version)s AND w.archived_at IS NULL
      AND (%(secret_id)s::bigint IS NULL OR EXISTS (
          SELECT 1 FROM webhook_secrets s WHERE s.id = %(secret_id)s AND s.revoked_at IS NULL))"""

# The intake of a workflow with flow control, run right after its locks in one
# transaction. Like intake.CREATE_EXECUTION (current target, idempotency claim, execution,
# steps, wake-ups, history, NOTIFY), plus the decision: `start` (a free slot and nobody
# ahead in its key's queue: roots ready now), `queue` (steps pending until a slot frees),
# `drop` (on_full drop_new: recorded cancelled, reason concurrency), `replace` (on_full
# cancel_oldest: starts now; the caller then cancels the oldest holders it returns, as
# many as bring the key back to its limit — so two racing intakes that both saw the same
# oldest holder still end at the limit) or `refuse` (max_queued reached: nothing is
# written at all).
GATED_INTAKE = f"""
WITH current AS (
    {STILL_CURRENT}
), holders AS (
    SELECT count(*) AS n FROM executions
    WHERE workflow_id = %(workflow_id)s AND concurrency_key = %(ckey)s::text AND {HOLDS_SLOT}
), ahead AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM executions
        WHERE workflow_id = %(workflow_id)s AND concurrency_key = %(ckey)s::text AND {IN_QUEUE}
        LIMIT 1) q
), queued AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM executions WHERE workflow_id = %(workflow_id)s AND {IN_QUEUE}
        LIMIT coalesce(%(max_queued)s::int, 0)) q
), decision AS (
    SELECT CASE
        WHEN %(limit)s::int IS NULL THEN 'start'
        WHEN holders.n < %(limit)s::int AND ahead.n = 0 THEN 'start'
        WHEN %(on_full)s::text = 'skip' THEN 'refuse'
        WHEN %(on_full)s::text = 'buffer_one' AND ahead.n > 0 THEN 'refuse'
        WHEN %(on_full)s::text = 'buffer_one' THEN 'queue'
        WHEN %(on_full)s::text = 'drop_new' THEN 'drop'
        WHEN %(on_full)s::text = 'cancel_oldest' AND ahead.n = 0 THEN 'replace'
        WHEN queued.n >= %(max_queued)s::int THEN 'refuse'
        ELSE 'queue' END AS mode
    FROM holders, ahead, queued
), claim AS (
    INSERT INTO idempotency_keys (workflow_id, origin, key, body_sha256, execution_id)
    SELECT %(workflow_id)s, %(key_origin)s, %(key)s, %(body_sha256)s, %(id)s
    FROM current, decision WHERE %(key)s::text IS NOT NULL AND decision.mode <> 'refuse'
    ON CONFLICT (workflow_id, origin, key) DO NOTHING
    RETURNING 1
), accepted AS (
    SELECT mode FROM current, decision WHERE %(key)s::text IS NULL AND mode <> 'refuse'
    UNION ALL SELECT mode FROM claim, decision
), {archive.ARCHIVE_CTE}, execution AS (
    INSERT INTO executions (id, workflow_id, version_id, status, input, idempotency_key,
                            concurrency_key, slot_at, deadline_at, expires_at, stop_reason,
                            finished_at, trigger, traceparent, delivery_id)
    SELECT %(id)s, %(workflow_id)s, %(version_id)s,
           CASE WHEN mode = 'drop' THEN '{_CANCELLED}' ELSE '{_QUEUED}' END,
           %(input)s::jsonb, %(key)s, %(ckey)s::text,
           CASE WHEN mode IN ('start', 'replace') AND %(ckey)s::text IS NOT NULL THEN now() END,
           now() + make_interval(secs => %(deadline_s)s::float8),
           now() + make_interval(secs => %(start_within_s)s::float8),
           CASE WHEN mode = 'drop' THEN 'concurrency' END,
           CASE WHEN mode = 'drop' THEN now() END,
           %(trigger)s, %(traceparent)s, {archive.DELIVERY_ID}
    FROM accepted
), new_steps AS (
    INSERT INTO steps (execution_id, step_id, type, position, status, ready_at, error,
                       finished_at)
    SELECT %(id)s, s.step_id, s.type, s.position,
           CASE WHEN mode = 'drop' THEN '{_STEP_CANCELLED}'
                WHEN s.root AND mode IN ('start', 'replace') THEN '{_READY}'
                ELSE '{_PENDING}' END,
           CASE WHEN s.root AND mode IN ('start', 'replace') THEN now() END,
           CASE WHEN mode = 'drop' THEN 'not run: concurrency limit reached (on_full drop_new)' END,
           CASE WHEN mode = 'drop' THEN now() END
    FROM accepted,
         unnest(%(step_ids)s::text[], %(types)s::text[], %(roots)s::bool[])
         WITH ORDINALITY AS s(step_id, type, root, position)
), wakeups AS (
    {INSERT_WAKEUPS}
    SELECT %(id)s, root FROM accepted, unnest(%(root_ids)s::text[]) AS root
    WHERE mode IN ('start', 'replace')
), history AS (
    INSERT INTO execution_events (execution_id, kind, detail)
    SELECT %(id)s, %(queued_kind)s, %(event)s::jsonb FROM accepted
    UNION ALL
    SELECT %(id)s, '{EventKind.SLOT_GRANTED}', jsonb_build_object('key', %(ckey)s::text)
    FROM accepted WHERE mode IN ('start', 'replace') AND %(ckey)s::text IS NOT NULL
    UNION ALL
    SELECT %(id)s, '{_DROPPED_KIND}', '{_DROPPED}'::jsonb
    FROM accepted WHERE mode = 'drop'
)
SELECT (SELECT count(*) FROM current), (SELECT count(*) FROM accepted),
       (SELECT mode FROM decision),
       ARRAY(SELECT id::text FROM executions
             WHERE workflow_id = %(workflow_id)s AND concurrency_key = %(ckey)s::text
               AND {HOLDS_SLOT}
             ORDER BY slot_at, id
             LIMIT (SELECT greatest(holders.n + 1 - %(limit)s::int, 0) FROM holders)),
       EXISTS (SELECT FROM accepted WHERE mode IN ('start', 'replace'))
"""
# Hand the free slots of one key to its queue, oldest first, under SLOT_LOCK: mark them,
# make their root steps ready (roots read from the pinned definition) with their
# wake-ups, and record it. The limit is the one of the version the queue's head pins.
# Queued rows another transaction holds (being cancelled or expired) are skipped. A paused
# workflow hands out no slot: its queue waits, in arrival order, for the resume (SPEC §14).
FILL_SLOTS = f"""
WITH head AS (
    SELECT version_id FROM executions
    WHERE workflow_id = %(workflow_id)s AND concurrency_key = %(ckey)s AND {IN_QUEUE}
    ORDER BY created_at, id LIMIT 1
), free AS (
    SELECT greatest({KEY_LIMIT.replace("e.concurrency_key", "%(ckey)s")} - (
               SELECT count(*) FROM executions
               WHERE workflow_id = %(workflow_id)s AND concurrency_key = %(ckey)s
                 AND {HOLDS_SLOT}), 0) AS n
    FROM head JOIN workflow_versions v ON v.id = head.version_id
), next AS (
    SELECT id, version_id FROM executions
    WHERE workflow_id = %(workflow_id)s AND concurrency_key = %(ckey)s AND {IN_QUEUE}
      AND (expires_at IS NULL OR expires_at > now())
      AND (deadline_at IS NULL OR deadline_at > now())
      AND NOT EXISTS (SELECT 1 FROM workflows w
                      WHERE w.id = %(workflow_id)s AND w.paused_at IS NOT NULL)
    ORDER BY created_at, id
    LIMIT coalesce((SELECT n FROM free), 0)
    FOR UPDATE SKIP LOCKED
), granted AS (
    UPDATE executions e SET slot_at = now(), updated_at = now()
    FROM next WHERE e.id = next.id
    RETURNING e.id, e.version_id
), roots AS (
    SELECT g.id, elem->>'id' AS step_id
    FROM granted g JOIN workflow_versions v ON v.id = g.version_id,
         jsonb_array_elements(v.definition->'steps') AS elem
    WHERE coalesce(jsonb_array_length(elem->'depends_on'), 0) = 0
), ready AS (
    UPDATE steps s SET status = '{_READY}', ready_at = now()
    FROM roots WHERE s.execution_id = roots.id AND s.step_id = roots.step_id
      AND s.status = 'pending'
    RETURNING s.execution_id, s.step_id
), wakeups AS (
    {INSERT_WAKEUPS} SELECT execution_id, step_id FROM ready
), history AS (
    INSERT INTO execution_events (execution_id, step_id, kind, detail)
    SELECT id, NULL, '{EventKind.SLOT_GRANTED}', jsonb_build_object('key', %(ckey)s::text)
    FROM granted
    UNION ALL
    SELECT execution_id, step_id, '{_READY_KIND}', '{_MADE_READY}'::jsonb
    FROM ready
)
SELECT count(*), CASE WHEN count(*) > 0 THEN {NOTIFY} END FROM granted
"""
# An operator retry takes a slot like any start, under SLOT_LOCK: the slots other
# executions of its key hold, and its own limit (from the version it pins).
RETRY_SLOT = f"""
SELECT {KEY_LIMIT},
       (SELECT count(*) FROM executions h
        WHERE h.workflow_id = e.workflow_id AND h.concurrency_key = e.concurrency_key
          AND h.id <> e.id AND {HOLDS_SLOT})
FROM executions e JOIN workflow_versions v ON v.id = e.version_id
WHERE e.id = %(id)s
"""
TAKE_SLOT = "UPDATE executions SET slot_at = now() WHERE id = %(id)s"
# Per workflow: executions waiting for a slot and executions holding one (metrics.py).
SLOT_GAUGES = f"""
SELECT w.key,
       count(*) FILTER (WHERE e.slot_at IS NULL AND e.status = 'queued'),
       count(*) FILTER (WHERE e.{HOLDS_SLOT.replace(" AND ", " AND e.")})
FROM executions e JOIN workflows w ON w.id = e.workflow_id
WHERE e.concurrency_key IS NOT NULL
  AND e.status IN ('queued', 'running', 'waiting', 'paused', 'needs_attention')
GROUP BY w.key ORDER BY w.key
"""
# Keys with a queue: the reconciler fills their free slots, which catches any slot freed
# by a transaction that could not hand it on.
QUEUED_KEYS = f"""
SELECT DISTINCT workflow_id, concurrency_key FROM executions WHERE {IN_QUEUE} LIMIT 1000
"""
# How fast a workflow's queue drains: slots handed out in the last minute.
DRAIN_RATE = """
SELECT count(*) FROM executions
WHERE workflow_id = %(workflow_id)s AND slot_at > now() - interval '60 seconds'
"""
# Why one queued execution waits: its key, how many are ahead, who holds the slots.
WHY_QUEUED = f"""
SELECT e.concurrency_key AS key,
       {KEY_LIMIT} AS limit,
       (SELECT count(*) FROM executions q
        WHERE q.workflow_id = e.workflow_id AND q.concurrency_key = e.concurrency_key
          AND q.slot_at IS NULL AND q.status = 'queued'
          AND (q.created_at, q.id) < (e.created_at, e.id)) AS ahead,
       ARRAY(SELECT h.id::text FROM executions h
             WHERE h.workflow_id = e.workflow_id AND h.concurrency_key = e.concurrency_key
               AND {HOLDS_SLOT}
             ORDER BY h.slot_at, h.id LIMIT 20) AS held_by
FROM executions e JOIN workflow_versions v ON v.id = e.version_id
WHERE e.id = %(id)s AND e.status = 'queued' AND e.slot_at IS NULL
  AND e.concurrency_key IS NOT NULL
"""


class QueueFull(ClientError):
    """The workflow already has `max_queued` queued executions; nothing was created.

    The webhook answers it with a Retry-After (api/hooks.py), which the class mapping of
    ClientError does not carry."""

    status = 429
    title = "Queue full"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class KeyUnresolved(ClientError):
    """The concurrency key template does not resolve against this webhook's body."""

    status = 422
    title = "Concurrency key unresolved"


@dataclass(frozen=True)
class Decision:
    """What the gated intake did: whether the target was current, whether it created the
    execution, its mode, and (for `replace`) the holders the caller must now cancel."""

    current: bool
    created: bool
    mode: str
    replaced: tuple[str, ...]


def is_controlled(definition: Definition) -> bool:
    """Whether a version's intake goes through GATED_INTAKE (any §8 option is set)."""
    return (
        definition.concurrency is not None
        or definition.deadline_s is not None
        or definition.start_within_s is not None
    )


def concurrency_key(definition: Definition, body: bytes) -> str | None:
    """The execution's key: '' for one queue per workflow, None without a limit."""
    concurrency = definition.concurrency
    if concurrency is None:
        return None
    if concurrency.key is None:
        return ""
    try:
        value = render(concurrency.key, {"input": json.loads(body)})
    except TemplateError as exc:
        raise KeyUnresolved(f"concurrency key {concurrency.key!r}: {exc}") from None
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if len(text) > MAX_KEY_CHARS or "\x00" in text:
        raise KeyUnresolved(
            f"concurrency key must render to at most {MAX_KEY_CHARS} characters without NUL"
        )
    if text == SCHEDULE_KEY:
        raise KeyUnresolved(f"concurrency key {SCHEDULE_KEY!r} is reserved for schedules")
    return text


def intake_params(definition: Definition, body: bytes) -> dict[str, Any]:
    """The flow-control part of GATED_INTAKE's parameters."""
    concurrency = definition.concurrency
    return {
        "ckey": concurrency_key(definition, body),
        "limit": concurrency.limit if concurrency else None,
        "on_full": concurrency.on_full if concurrency else None,
        "max_queued": concurrency.max_queued if concurrency else None,
        "deadline_s": definition.deadline_s,
        "start_within_s": definition.start_within_s,
        "trigger": "webhook",
    }


def create(conn: psycopg.Connection, params: dict[str, Any]) -> Decision:
    """Run the gated intake under its locks, in one transaction; raises QueueFull on
    `refuse` (the caller checks for a replay first: a known key is never refused)."""
    with conn.transaction():
        if params["ckey"] is not None:
            if params["max_queued"] is not None:
                conn.execute(QUEUE_LOCK, params)
            conn.execute(SLOT_LOCK, params)
        current, created, mode, oldest, woke = one(conn.execute(GATED_INTAKE, params))
        if mode == "refuse" and current:
            (started,) = one(conn.execute(DRAIN_RATE, params))
    if woke:
        notify_relay(conn)
    replaced = tuple(oldest) if mode == "replace" else ()
    decision = Decision(bool(current), bool(created), mode, replaced)
    if mode == "refuse" and current:
        raise QueueFull(
            f"the workflow already has {params['max_queued']} queued executions "
            "(concurrency.max_queued); nothing was created",
            retry_after(int(started)),
        )
    return decision


def retry_after(started_last_minute: int) -> int:
    """Seconds until the queue has likely drained by one, from its measured drain rate."""
    if started_last_minute <= 0:
        return IDLE_RETRY_AFTER_S
    return max(1, min(IDLE_RETRY_AFTER_S, math.ceil(60 / started_last_minute)))


def fill_slots(conn: psycopg.Connection, workflow_id: int, key: str) -> int:
    """Start queued executions of one key while it has free slots, in the caller's
    transaction; returns how many started."""
    params = {"workflow_id": workflow_id, "ckey": key}
    conn.execute(SLOT_LOCK, params)
    (granted, _) = one(conn.execute(FILL_SLOTS, params))
    return int(granted)


def take_slot_for_retry(conn: psycopg.Connection, workflow_id: int, key: str, eid: str) -> None:
    """Give an execution an operator is retrying a slot of its key, or refuse (Conflict)
    while the key's slots are all held: a retry never runs past the limit."""
    conn.execute(SLOT_LOCK, {"workflow_id": workflow_id, "ckey": key})
    limit, held = one(conn.execute(RETRY_SLOT, {"id": eid}))
    if limit is not None and held >= limit:
        raise Conflict(
            f"all {limit} concurrency slots of key {key!r} are held; retry it when one frees"
        )
    conn.execute(TAKE_SLOT, {"id": eid})


def fill_all(conn: psycopg.Connection) -> int:
    """Reconcile: fill the free slots of every key with a queue, one transaction per key."""
    started = 0
    for workflow_id, key in conn.execute(QUEUED_KEYS).fetchall():
        with conn.transaction():
            started += fill_slots(conn, workflow_id, key)
    return started


# The flow-control facts of one execution, for the API and the CLI.
FLOW_STATE = """
SELECT e.concurrency_key, e.stop_reason, e.deadline_at, e.expires_at, e.slot_at,
       e.pause_reason, e.paused_from, w.paused_at, w.paused_by
FROM executions e JOIN workflows w ON w.id = e.workflow_id
WHERE e.id = %(id)s
"""


def flow_state(conn: psycopg.Connection, execution_id: str) -> dict[str, Any]:
    """What flow control says about an execution: its key, why it stopped, its time
    limits, for a queued one that waits for a slot, why (see why_queued), and whether it
    or its workflow is paused (SPEC §14: `paused` {reason, was}, `workflow_paused`
    {since, by})."""
    row = conn.execute(FLOW_STATE, {"id": execution_id}).fetchone()
    if row is None:
        return {}
    key, reason, deadline_at, expires_at, slot_at, pause_reason, paused_from = row[:7]
    workflow_paused_at, workflow_paused_by = row[7:]
    return {
        "paused": {"reason": pause_reason, "was": paused_from} if pause_reason else None,
        "workflow_paused": (
            {"since": workflow_paused_at.isoformat(), "by": workflow_paused_by}
            if workflow_paused_at
            else None
        ),
        "concurrency_key": key,
        "stop_reason": reason,
        "deadline_at": deadline_at.isoformat() if deadline_at else None,
        "expires_at": expires_at.isoformat() if expires_at else None,
        "slot_at": slot_at.isoformat() if slot_at else None,
        "waiting_for_slot": why_queued(conn, execution_id),
    }


def why_queued(conn: psycopg.Connection, execution_id: str) -> dict[str, Any] | None:
    """For an execution waiting for a slot: its key, the limit, how many are ahead of it
    and which executions hold the slots (up to 20). None when it does not wait for one."""
    row = conn.execute(WHY_QUEUED, {"id": execution_id}).fetchone()
    if row is None:
        return None
    key, limit, ahead, held_by = row
    return {"key": key, "limit": limit, "ahead": int(ahead), "held_by": list(held_by)}
