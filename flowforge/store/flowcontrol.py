"""Concurrency slots and queue backpressure (docs/contract.md#flow-control), as SQL over execution
rows.

There is no counter. An execution holds a slot of its (workflow, concurrency key) from
`slot_at` until it is terminal — a cancel, a deadline or cancel_oldest that leaves a
request in flight keeps the slot until that request is recorded and the execution ends,
so a target never sees more requests of a key at once than its limit (docs/contract.md#slots); a
queued execution without `slot_at`
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

from flowforge.domain.definitions import bounds
from flowforge.domain.definitions.flowcontrol import KeyUnrendered, render_concurrency_key
from flowforge.domain.definitions.shapes import SCHEDULE_KEY, Concurrency, Definition
from flowforge.domain.model import (
    LIVE_EXECUTION_SQL,
    EventKind,
    OnFull,
    StepStatus,
    step_event,
    transition,
)
from flowforge.errors import ClientError, Conflict
from flowforge.store.creation import create_execution
from flowforge.store.db import (
    COMMIT_WITHOUT_FLUSH,
    FLUSH_BARRIER,
    notify_relay,
    one,
    pipelined_transaction,
)
from flowforge.store.outbox import INSERT_WAKEUPS

logger = logging.getLogger(__name__)

# What the set-based statements below write are the engine's words (model.py), the same a
# Run would produce: a started execution's roots `pending -> ready`.
_PENDING, _READY = StepStatus.PENDING.value, StepStatus.READY.value
_READY_KIND = step_event(StepStatus.READY)
_MADE_READY = json.dumps(transition(_PENDING, _READY))


# The concurrency key of a schedule's ticks (docs/contract.md#schedules): overlap `skip`,
# `buffer_one` and `cancel_other` are a limit of 1 on it, with on_full `skip` (nothing written),
# `buffer_one` (queue at most one) and `cancel_oldest`. No rendered key may take it
# (concurrency_key).
def key_limit(key: str = "e.concurrency_key") -> str:
    """The slot limit of the concurrency key `key` (an SQL expression) under the version
    `v` it pins: 1 for schedule ticks."""
    return (
        f"CASE WHEN {key} = '{SCHEDULE_KEY}' THEN 1"
        " ELSE (v.definition->'concurrency'->>'limit')::int END"
    )


# The slot limit of an execution `e` pinning version `v`.
KEY_LIMIT = key_limit()
# Keys are stored and shown; a bounded length keeps index entries small.
MAX_KEY_CHARS = bounds.MAX_KEY_CHARS
# Retry-After of a refused webhook, in seconds, when nothing started in the last minute.
IDLE_RETRY_AFTER_S = 60


def holds_slot(row: str = "") -> str:
    """Whether the `executions` row `row` (an alias; none inside single-table subqueries)
    holds a slot of its key: from when it took one until it is terminal (docs/contract.md#slots),
    also while a cancel of it is in flight."""
    prefix = f"{row}." if row else ""
    return f"{prefix}slot_at IS NOT NULL AND {prefix}status IN {LIVE_EXECUTION_SQL}"


# Predicates over one unqualified `executions` row (used inside single-table subqueries).
HOLDS_SLOT = holds_slot()
# A holder nobody asked to stop yet: what cancel_oldest may still replace.
LIVE_HOLDER = f"{HOLDS_SLOT} AND cancel_requested_at IS NULL"
IN_QUEUE = "slot_at IS NULL AND concurrency_key IS NOT NULL AND status = 'queued'"

# Of a key's live holders and queued executions, which cancel_oldest replaces first: the
# holders by when they took their slot, then the queue in arrival order.
OLDEST_FIRST = "slot_at IS NULL, coalesce(slot_at, created_at), id"


def slot_lock_id(workflow_id: str, key: str) -> str:
    """The advisory lock id of one (workflow, concurrency key) slot set, from two SQL
    expressions: the one spelling of it, so every taker of a slot lock takes the same."""
    return f"hashtextextended({workflow_id}::text || '/' || {key}, 0)"


# The key's slot lock, held to the end of the transaction.
SLOT_LOCK = f"SELECT pg_advisory_xact_lock({slot_lock_id('%(workflow_id)s', '%(ckey)s')})"
# The workflow's queue lock: makes the max_queued count exact across keys and API processes.
QUEUE_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%(workflow_id)s::text, 8))"

# The intake of a workflow with flow control, run right after its locks in one
# transaction: creation.create_execution with the decision. `start` when there is a free
# slot and nobody ahead in its key's queue, else as on_full says (for a schedule's key, as
# its overlap policy says): `refuse` (skip, buffer_one with one already queued, or
# max_queued reached), `queue`, `drop` (drop_new) or `replace` (cancel_oldest: queued at
# the head of what will run; the caller then cancels the oldest of the key's live holders
# and queued executions it returns, as many as bring what will run back to the limit — so
# two racing intakes that both saw the same oldest holder still end at the limit. The new
# one starts when a cancelled holder is terminal: at once for one that was queued or
# waiting, after its request for one with a request in flight).
DECISION = f"""
, holders AS (
    SELECT count(*) AS n FROM executions
    WHERE workflow_id = %(workflow_id)s AND concurrency_key = %(ckey)s::text AND {HOLDS_SLOT}
), live AS (
    SELECT count(*) AS n FROM executions
    WHERE workflow_id = %(workflow_id)s AND concurrency_key = %(ckey)s::text AND {LIVE_HOLDER}
), in_queue AS (
    SELECT count(*) AS n FROM executions
    WHERE workflow_id = %(workflow_id)s AND concurrency_key = %(ckey)s::text AND {IN_QUEUE}
      AND %(on_full)s::text = 'cancel_oldest'
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
        WHEN %(on_full)s::text = '{OnFull.SKIP}' THEN 'refuse'
        WHEN %(on_full)s::text = '{OnFull.BUFFER_ONE}' AND ahead.n > 0 THEN 'refuse'
        WHEN %(on_full)s::text = '{OnFull.BUFFER_ONE}' THEN 'queue'
        WHEN %(on_full)s::text = '{OnFull.DROP_NEW}' THEN 'drop'
        WHEN %(on_full)s::text = '{OnFull.CANCEL_OLDEST}' THEN 'replace'
        WHEN queued.n >= %(max_queued)s::int THEN 'refuse'
        ELSE 'queue' END AS mode
    FROM holders, ahead, queued
)"""
# What a `replace` cancels: the oldest of the key's live holders and queued executions,
# holders first by when they took their slot, as many as bring what will run back to the
# limit.
REPLACED = f"""ARRAY(SELECT id::text FROM executions
             WHERE workflow_id = %(workflow_id)s AND concurrency_key = %(ckey)s::text
               AND (({LIVE_HOLDER}) OR ({IN_QUEUE}))
             ORDER BY {OLDEST_FIRST}
             LIMIT (SELECT greatest(live.n + in_queue.n + 1 - %(limit)s::int, 0)
                    FROM live, in_queue))"""
GATED_INTAKE = create_execution(DECISION, REPLACED)
# The same with the execution's search attributes (docs/contract.md#search-attributes).
GATED_ATTRIBUTED = create_execution(DECISION, REPLACED, attributes=True)
# Hand the free slots of one key to its queue, oldest first, under SLOT_LOCK: mark them,
# make their root steps ready (roots read from the pinned definition) with their
# wake-ups, and record it. The limit is the one of the version the queue's head pins.
# No NOTIFY: the caller's commit is followed by one (a unit of work's NOTIFY_IF_PENDING,
# or db.notify_relay in fill_all and pausing), never carries one.
# Queued rows another transaction holds (being cancelled or expired) are skipped. A paused
# workflow hands out no slot: its queue waits, in arrival order, for the resume
# (docs/contract.md#pause).
FILL_SLOTS = f"""
WITH head AS (
    SELECT version_id FROM executions
    WHERE workflow_id = %(workflow_id)s AND concurrency_key = %(ckey)s AND {IN_QUEUE}
    ORDER BY created_at, id LIMIT 1
), free AS (
    SELECT greatest({key_limit("%(ckey)s")} - (
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
    UPDATE steps s SET status = '{_READY}', ready_at = now(), ready_since = now()
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
SELECT count(*) FROM granted
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
       count(*) FILTER (WHERE {holds_slot("e")})
FROM executions e JOIN workflows w ON w.id = e.workflow_id
WHERE e.concurrency_key IS NOT NULL
  AND e.status IN {LIVE_EXECUTION_SQL}
GROUP BY w.key ORDER BY w.key
"""
# Keys with a queue: the reconciler fills their free slots, which catches any slot freed
# by a transaction that could not hand it on.
QUEUED_KEYS = f"""
SELECT DISTINCT workflow_id, concurrency_key FROM executions WHERE {IN_QUEUE} LIMIT 1000
"""
# How fast a workflow's queue drains: slots handed out in the last minute. Run on a
# refusal only, it also records the queue.full notification of a max_queued crossing
# (sql/0067: once per crossing, only while an endpoint subscribes), no statement more.
DRAIN_RATE = """
SELECT (SELECT count(*) FROM executions
        WHERE workflow_id = %(workflow_id)s AND slot_at > now() - interval '60 seconds'),
       (SELECT notify_queue_full(%(workflow_id)s, %(max_queued)s::int)
        WHERE %(max_queued)s::int IS NOT NULL)
"""
# A child refused for max_queued records the same (in its parent's transaction).
QUEUE_FULL = "SELECT notify_queue_full(%(workflow_id)s, %(max_queued)s::int)"
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
    execution, its mode, and (for `replace`) the executions the caller must now cancel:
    the key's oldest live holders, then its oldest queued ones."""

    current: bool
    created: bool
    mode: str
    replaced: tuple[str, ...]


def is_controlled(definition: Definition) -> bool:
    """Whether a version's intake goes through GATED_INTAKE (any option of
    docs/contract.md#flow-control is set)."""
    return (
        definition.concurrency is not None
        or definition.deadline_s is not None
        or definition.start_within_s is not None
    )


def concurrency_key(definition: Definition, body: bytes) -> str | None:
    """The execution's key: '' for one queue per workflow, None without a limit."""
    if definition.concurrency is None:
        return None
    try:
        return render_concurrency_key(definition, json.loads(body))
    except KeyUnrendered as exc:
        raise KeyUnresolved(str(exc)) from None


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
    `refuse` (the caller checks for a replay first: a known key is never refused).

    Every intake and every end of an execution of a key queues for its SLOT_LOCK, held to
    the end of the transaction. Sent one statement at a time, it lasted three round trips
    to this process (on a busy machine, each a wait for the scheduler) and the commit's
    wait for the disk: a key admitted one execution per such round, and a limit of 8 ran
    at a third of the unlimited rate. So the locks, the statement and the COMMIT travel in
    one pipeline, the commit does not wait for the disk (db.COMMIT_WITHOUT_FLUSH), and
    db.FLUSH_BARRIER makes it durable before the caller answers or acts on it (a later
    holder of the lock commits after it in the WAL, so it is never durable without it).
    Inside the caller's transaction (a source's fan-out), a savepoint of it, whose commit
    is the caller's."""
    gated = params["ckey"] is not None
    alone = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with pipelined_transaction(conn) if alone else conn.transaction():
        if gated:
            if params["max_queued"] is not None:
                conn.execute(QUEUE_LOCK, params)
            conn.execute(SLOT_LOCK, params)
            if alone:
                conn.execute(COMMIT_WITHOUT_FLUSH)
        statement = GATED_ATTRIBUTED if "attr_names" in params else GATED_INTAKE
        intake = conn.execute(statement, params)
    current, created, mode, oldest, woke = one(intake)
    if gated and alone:
        conn.execute(FLUSH_BARRIER)
    if mode == "refuse" and current:
        # Only the Retry-After's estimate: it need not be read under the locks.
        started, _ = one(conn.execute(DRAIN_RATE, params))
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


# A workflow step's child (docs/contract.md#child-workflows) of a workflow with a concurrency limit:
# the same decision as GATED_INTAKE, written with the child's links; refused, it is recorded.
GATED_CHILD = create_execution(DECISION, REPLACED, child=True)
GATED_CHILD_ATTRIBUTED = create_execution(DECISION, REPLACED, child=True, attributes=True)


def admit_child(
    conn: psycopg.Connection, params: dict[str, Any], concurrency: Concurrency
) -> tuple[bool, bool, str]:
    """Admit a child execution (children.start's parameters, with its `ckey`) like any
    execution of its workflow, in the parent's transaction, under the same locks taken
    after the parent's row (the lock order above). Returns whether the target was current,
    whether it created the child, and the mode: `refuse` (max_queued) writes it like a
    `drop`, so the parent's step has a child whose end it takes; the holders a `replace`
    displaces are stopped by the reconciler (reconciler.SURPLUS_HOLDERS)."""
    params = {
        **params,
        "limit": concurrency.limit,
        "on_full": concurrency.on_full,
        "max_queued": concurrency.max_queued,
        "trigger": "workflow",
    }
    if concurrency.max_queued is not None:
        conn.execute(QUEUE_LOCK, params)
    conn.execute(SLOT_LOCK, params)
    statement = GATED_CHILD_ATTRIBUTED if "attr_names" in params else GATED_CHILD
    current, created, mode, _, _ = one(conn.execute(statement, params))
    if mode == "refuse" and current and concurrency.max_queued is not None:
        conn.execute(QUEUE_FULL, params)
    return bool(current), bool(created), str(mode)


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
    (granted,) = one(conn.execute(FILL_SLOTS, params))
    return int(granted)


def hand_on(conn: psycopg.Connection, workflow_id: int, key: str) -> None:
    """fill_slots for the unit of work of an execution that freed its slot: nothing is
    read back, so in its pipeline the lock and the hand-over travel with the COMMIT and the
    key's lock is not held over a round trip to this process."""
    params = {"workflow_id": workflow_id, "ckey": key}
    conn.execute(SLOT_LOCK, params)
    conn.execute(FILL_SLOTS, params)


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
    if started:
        notify_relay(conn)
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
    or its workflow is paused (docs/contract.md#pause: `paused` {reason, was}, `workflow_paused`
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
