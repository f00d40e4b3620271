"""Schedules (docs/contract.md#schedules): each workflow's schedule row, the ledger of its ticks,
and the statements that decide a tick, which usecases/ticks.py runs for the worker's
scheduler, the API and the CLI.

How a tick is decided, once, whatever the number of workers: the schedule's row is
claimed FOR UPDATE SKIP LOCKED when its `fire_at` is due, so one worker at a time decides
its ticks; the tick's execution is created with the idempotency key `schedule:<tick
instant>` in the system's key space (origin `system`, which no webhook's key can reach)
and trigger `schedule`, and the tick's ledger row and the row's next tick are
written in the same transaction. A worker killed at any point either committed all three
or none. The executions of the ticks that start whatever else happens (overlap `allow`,
or a free slot) are created set-based for a whole batch of schedules (fire_batch); every
other tick by the flow-control intake statement, one by one (Ticker.fire).

Overlap reuses flow control's slots (flowcontrol.SCHEDULE_KEY, a limit of 1): `skip` is
on_full `skip` (nothing written), `buffer_one` queues at most one, `cancel_other` is
on_full `cancel_oldest`, `allow` has no slot of its own (the workflow's `concurrency`, if
any, applies as to any execution).

The ledger is bounded: ticks older than the catch-up window are written one row each up
to MISSED_ROWS, beyond that as one summary row; each schedule keeps its newest
LEDGER_KEEP rows (trim, run by the scheduler once a minute).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flowforge.domain.definitions import Definition, Schedule, parse_schedule
from flowforge.domain.model import (
    LIVE_EXECUTION_SQL,
    KeyOrigin,
    LedgerOutcome,
    sql_list,
)
from flowforge.errors import ClientError, NotFound
from flowforge.store import creation, flowcontrol
from flowforge.store.db import one

# Ticks decided per claimed row and transaction (a catch-up goes on in the next pass).
TICKS_PER_PASS = 100
# Late ticks written one row each; more than this become one summary row.
MISSED_ROWS = 100
# Ledger rows kept per schedule.
LEDGER_KEEP = 1_000
# What the API shows.
NEXT_FIRES = 10
LEDGER_SHOWN = 100
# A backfill decides at most this many ticks.
MAX_BACKFILL_TICKS = 1_000
# Who stops an execution a scheduled tick replaced (overlap cancel_other), in its history.
SCHEDULER: dict[str, Any] = {"kind": "system", "name": "scheduler (overlap cancel_other)"}

# The schedule row of a workflow, locked by publish while it re-derives it.
LOCK_ROW = "SELECT next_tick_at FROM schedules WHERE workflow_id = %(workflow_id)s FOR UPDATE"
UPSERT_ROW = """
INSERT INTO schedules (workflow_id, version_id, spec, next_tick_at, fire_at)
VALUES (%(workflow_id)s, %(version_id)s, %(spec)s, %(next_tick_at)s, %(fire_at)s)
ON CONFLICT (workflow_id) DO UPDATE SET
    version_id = excluded.version_id, spec = excluded.spec,
    next_tick_at = excluded.next_tick_at, fire_at = excluded.fire_at, updated_at = now()
"""
# Due schedules, claimed for this transaction; rows another worker holds are skipped.
CLAIM_DUE = """
SELECT s.workflow_id, s.version_id, w.key, s.spec, s.next_tick_at, s.paused_at IS NOT NULL,
       now()
FROM schedules s JOIN workflows w ON w.id = s.workflow_id
WHERE s.fire_at <= now() AND w.archived_at IS NULL
ORDER BY s.fire_at
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED
"""
# Schedules claimed (and decided) per transaction: fewer round trips per tick when
# thousands are due at once; one row's ticks are still bounded by TICKS_PER_PASS. Each
# gated schedule of a batch holds its slot lock to the commit (one lock-table entry).
CLAIM_BATCH = 200
# The next tick of every schedule a pass decided, in one statement. The set-based
# statements take their rows as one JSON array (jsonb_to_recordset): one parameter to
# send instead of a dozen arrays to adapt, a few microseconds a tick less.
ADVANCE_ALL = """
UPDATE schedules s SET next_tick_at = a.next_tick_at, fire_at = a.fire_at, updated_at = now()
FROM jsonb_to_recordset(%(rows)s::jsonb)
     AS a(workflow_id bigint, next_tick_at timestamptz, fire_at timestamptz)
WHERE s.workflow_id = a.workflow_id
"""
# lag_s: from the tick's fire time to this row's write, which is the last statement
# before the commit that makes the execution visible (clock_timestamp, not now()).
INSERT_LEDGER = """
INSERT INTO schedule_ticks (workflow_id, tick_at, outcome, execution_id, reason, actor, lag_s)
VALUES (%(workflow_id)s, %(tick_at)s, %(outcome)s, %(execution_id)s, %(reason)s, %(actor)s,
        extract(epoch FROM clock_timestamp() - %(fires_at)s::timestamptz))
"""
# A pass's ledger rows in one statement, in tick order (ids follow the array order).
INSERT_LEDGER_ALL = """
INSERT INTO schedule_ticks (workflow_id, tick_at, outcome, execution_id, reason, lag_s)
SELECT workflow_id, tick_at, outcome, execution_id, reason,
       extract(epoch FROM clock_timestamp() - fires_at)
FROM ROWS FROM (jsonb_to_recordset(%(rows)s::jsonb)
                AS (workflow_id bigint, tick_at timestamptz, outcome text,
                    execution_id uuid, reason text, fires_at timestamptz))
     WITH ORDINALITY AS r(workflow_id, tick_at, outcome, execution_id, reason, fires_at, n)
ORDER BY n
"""
# The slot locks of a batch's gated schedules (flowcontrol.SLOT_LOCK of each, in workflow
# order), taken before BATCH_CLAIM so its statement snapshot sees every slot handed out.
BATCH_SLOT_LOCKS = f"""
SELECT count(pg_advisory_xact_lock(
           {flowcontrol.slot_lock_id("w", f"'{flowcontrol.SCHEDULE_KEY}'")}))
FROM (SELECT DISTINCT w FROM unnest(%(workflow_ids)s::bigint[]) AS w ORDER BY w) locks
"""
# Many ticks' executions in two statements: flowcontrol.GATED_INTAKE's `start` for each
# tick (the only mode they take), set-based. First the claim: a tick's idempotency key
# `schedule:<instant>`, in the system's key space (origin `system`), is claimed only if
# its target is still current (the newest version, not archived) and, for a gated tick
# (`ckey` @schedule: overlap skip, buffer_one, cancel_other), its schedule's slot is free
# with nobody queued for it, under BATCH_SLOT_LOCKS. Of two workers racing for a tick, one
# claims it; the other's insert waits for that commit and gets no row. Returns the
# execution ids claimed.
BATCH_CLAIM = f"""
{creation.CLAIM_KEY}
SELECT t.workflow_id, '{KeyOrigin.SYSTEM}', t.key, decode(t.body_sha256, 'hex'), t.id
FROM jsonb_to_recordset(%(ticks)s::jsonb)
     AS t(id uuid, workflow_id bigint, version int, key text, body_sha256 text, ckey text)
WHERE EXISTS (SELECT 1 FROM workflows w
              WHERE w.id = t.workflow_id AND w.latest_version = t.version
                AND w.archived_at IS NULL)
  AND (t.ckey IS NULL OR NOT EXISTS (
      SELECT 1 FROM executions
      WHERE workflow_id = t.workflow_id AND concurrency_key = t.ckey
        AND (({flowcontrol.HOLDS_SLOT}) OR ({flowcontrol.IN_QUEUE}))))
{creation.ON_CLAIMED}
RETURNING execution_id
"""
# Then, for the claimed ticks only, their executions: creation.BATCH_CREATE.
# The schedule of a workflow by key, locked for an operator action (waits for a worker
# deciding a tick of it: an action and a tick never interleave).
LOCK_BY_KEY = """
SELECT s.workflow_id, s.spec, s.next_tick_at, s.paused_at, s.paused_by, now()
FROM schedules s JOIN workflows w ON w.id = s.workflow_id
WHERE w.key = %(key)s AND w.archived_at IS NULL
FOR UPDATE OF s
"""
READ_BY_KEY = """
SELECT s.workflow_id, s.spec, s.next_tick_at, s.fire_at, s.paused_at, s.paused_by, v.version,
       now()
FROM schedules s JOIN workflows w ON w.id = s.workflow_id
JOIN workflow_versions v ON v.id = s.version_id
WHERE w.key = %(key)s
"""
LEDGER = """
SELECT tick_at, outcome, execution_id, reason, actor, lag_s, created_at FROM schedule_ticks
WHERE workflow_id = %(workflow_id)s ORDER BY id DESC LIMIT %(limit)s
"""
SET_PAUSED = """
UPDATE schedules SET paused_at = %(paused_at)s, paused_by = %(actor)s, updated_at = now()
WHERE workflow_id = %(workflow_id)s
"""
# Whether a tick instant already fired (its idempotency key may be forgotten, housekeeping.py).
FIRED_AT = f"""
SELECT execution_id FROM schedule_ticks
WHERE workflow_id = %(workflow_id)s AND tick_at = %(tick_at)s
  AND outcome IN {sql_list((LedgerOutcome.FIRED, LedgerOutcome.BUFFERED))}
LIMIT 1
"""
# The live execution that holds (or waits for) the schedule's slot, for a skip's reason.
LIVE = f"""
SELECT id FROM executions
WHERE workflow_id = %(workflow_id)s AND concurrency_key = '{flowcontrol.SCHEDULE_KEY}'
  AND status IN {LIVE_EXECUTION_SQL}
ORDER BY created_at LIMIT 1
"""
# Keep the newest LEDGER_KEEP rows of every schedule (one statement, index-driven).
TRIM = """
DELETE FROM schedule_ticks t
USING (SELECT s.workflow_id,
              (SELECT x.id FROM schedule_ticks x WHERE x.workflow_id = s.workflow_id
               ORDER BY x.id DESC OFFSET %(keep)s LIMIT 1) AS floor
       FROM schedules s) f
WHERE t.workflow_id = f.workflow_id AND t.id <= f.floor
"""


class NoSchedule(NotFound):
    """This workflow's newest version has no schedule."""


class BackfillInvalid(ClientError):
    """The backfill range is not a bounded range of past instants."""

    status = 422
    title = "Invalid backfill"


@dataclass
class TickOutcome:
    """What became of one tick: for the ledger, the logs and the metrics
    `flowforge_schedule_ticks_total{outcome}` and `flowforge_schedule_lag_seconds`."""

    workflow: str
    tick_at: datetime
    outcome: LedgerOutcome
    execution_id: str | None = None
    reason: str | None = None
    # Fired and buffered ticks: from the fire time to the start of the transaction that
    # created the execution (the ledger's lag_s runs to its commit), and the fire time.
    lag_s: float | None = None
    replaced: tuple[str, ...] = field(default=(), repr=False)
    fires_at: datetime | None = None

    def view(self) -> dict[str, Any]:
        """The JSON shape of an outcome in API answers."""
        return {
            "tick_at": iso(self.tick_at),
            "outcome": self.outcome,
            "execution_id": self.execution_id,
            "reason": self.reason,
        }


def tick_input(schedule: Schedule, tick: datetime) -> dict[str, Any]:
    """A tick's execution input: the schedule's input and the tick instant."""
    return {**schedule.input, "scheduled_at": iso(tick)}


def tick_key(tick: datetime) -> str:
    """A tick's idempotency key: one execution per tick instant, whatever fires it."""
    return f"schedule:{iso(tick)}"


def iso(instant: datetime) -> str:
    """An instant as the ledger and the idempotency key spell it: UTC, `Z`, microseconds
    only when there are any."""
    text = instant.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


def jitter(workflow_id: int, tick: datetime, jitter_s: float) -> timedelta:
    """The delay of one tick's fire, the same on every worker (a hash, not a random
    draw): a jitter moves when a tick fires, never its instant or its key."""
    if jitter_s <= 0:
        return timedelta(0)
    digest = hashlib.sha256(f"{workflow_id}/{iso(tick)}".encode()).digest()
    fraction = int.from_bytes(digest[:8]) / 2**64
    return timedelta(seconds=round(fraction * jitter_s, 3))


def fire_time(workflow_id: int, schedule: Schedule, tick: datetime | None) -> datetime | None:
    """When a tick fires: its instant plus its jitter."""
    return None if tick is None else tick + jitter(workflow_id, tick, schedule.jitter_s)


def derive(
    conn: psycopg.Connection,
    workflow_id: int,
    version_id: int,
    document: Any,
    definition: Definition,
) -> None:
    """Re-derive a workflow's schedule row from a version being published, in the publish
    transaction. The next tick is the new schedule's first at or after the old row's next
    tick (or now, whichever is earlier): ticks before it were decided under the old
    schedule, so none is decided twice, and none between is lost."""
    row = conn.execute(LOCK_ROW, {"workflow_id": workflow_id}).fetchone()
    schedule = definition.schedule
    if schedule is None:
        if row is not None:
            conn.execute(
                UPSERT_ROW,
                {
                    "workflow_id": workflow_id,
                    "version_id": version_id,
                    "spec": None,
                    "next_tick_at": None,
                    "fire_at": None,
                },
            )
        return
    (now,) = one(conn.execute("SELECT now()"))
    anchor = now if row is None or row[0] is None else min(row[0], now)
    tick = schedule.next_after(anchor - timedelta(microseconds=1))
    conn.execute(
        UPSERT_ROW,
        {
            "workflow_id": workflow_id,
            "version_id": version_id,
            "spec": Jsonb(document["trigger"]["schedule"]),
            "next_tick_at": tick,
            "fire_at": fire_time(workflow_id, schedule, tick),
        },
    )


def ledger_row(workflow_id: int, outcome: TickOutcome, actor: Any = None) -> dict[str, Any]:
    """INSERT_LEDGER's parameters for one outcome."""
    return {
        "workflow_id": workflow_id,
        "tick_at": outcome.tick_at,
        "outcome": outcome.outcome,
        "execution_id": outcome.execution_id,
        "reason": outcome.reason,
        "actor": Jsonb(actor) if actor is not None else None,
        # Only ticks that created an execution have a lag.
        "fires_at": outcome.fires_at if outcome.lag_s is not None else None,
    }


def lock_schedule(
    conn: psycopg.Connection, key: str
) -> tuple[int, Schedule, datetime | None, Any, datetime]:
    """The schedule of a workflow, its row locked for an operator action."""
    row = conn.execute(LOCK_BY_KEY, {"key": key}).fetchone()
    if row is None or row[1] is None:
        raise NoSchedule(f"workflow {key!r} has no schedule")
    workflow_id, spec, next_tick_at, paused_at, _, now = row
    return workflow_id, parse_schedule(spec), next_tick_at, paused_at, now


def set_paused(
    conn: psycopg.Connection, key: str, paused: bool, actor: dict[str, Any]
) -> dict[str, Any]:
    """Pause or resume a schedule (idempotent), recorded in the ledger with the actor.
    While paused, each due tick is ledgered `paused` and does not fire; resuming fires the
    ticks from then on, never the paused ones."""
    with conn.transaction():
        workflow_id, _, _, paused_at, now = lock_schedule(conn, key)
        if (paused_at is not None) != paused:
            conn.execute(
                SET_PAUSED,
                {
                    "workflow_id": workflow_id,
                    "paused_at": now if paused else None,
                    "actor": Jsonb(actor) if paused else None,
                },
            )
            outcome = LedgerOutcome.PAUSE if paused else LedgerOutcome.RESUME
            ticked = TickOutcome(key, now, outcome, reason="by an operator")
            conn.execute(INSERT_LEDGER, ledger_row(workflow_id, ticked, actor))
    return show(conn, key)


def show(conn: psycopg.Connection, key: str) -> dict[str, Any]:
    """A schedule as the API shows it: its definition, whether it is paused, its next
    NEXT_FIRES fire times in its zone and in UTC, and its last LEDGER_SHOWN ledger rows."""
    row = conn.execute(READ_BY_KEY, {"key": key}).fetchone()
    if row is None or row[1] is None:
        raise NoSchedule(f"workflow {key!r} has no schedule")
    workflow_id, spec, next_tick_at, _, paused_at, paused_by, version, _ = row
    schedule = parse_schedule(spec)
    zone = ZoneInfo(schedule.timezone)
    upcoming: list[dict[str, Any]] = []
    tick = next_tick_at
    while tick is not None and len(upcoming) < NEXT_FIRES:
        upcoming.append(
            {
                "tick_at": iso(tick),
                "local": tick.astimezone(zone).isoformat(),
                "fires_at": iso(fire_time(workflow_id, schedule, tick) or tick),
            }
        )
        tick = schedule.next_after(tick)
    with conn.cursor(row_factory=dict_row) as cur:
        ledger = cur.execute(LEDGER, {"workflow_id": workflow_id, "limit": LEDGER_SHOWN}).fetchall()
    return {
        "workflow": key,
        "version": version,
        "schedule": spec,
        "timezone": schedule.timezone,
        "paused": paused_at is not None,
        "paused_at": paused_at.isoformat() if paused_at else None,
        "paused_by": paused_by,
        "next": upcoming,
        "ledger": [
            {
                "tick_at": iso(r["tick_at"]),
                "outcome": r["outcome"],
                "execution_id": str(r["execution_id"]) if r["execution_id"] else None,
                "reason": r["reason"],
                "actor": r["actor"],
                "lag_s": r["lag_s"],
                "created_at": r["created_at"].isoformat(),
            }
            for r in ledger
        ],
    }


def trim(conn: psycopg.Connection) -> int:
    """Keep the newest LEDGER_KEEP ledger rows of every schedule; returns how many went."""
    return conn.execute(TRIM, {"keep": LEDGER_KEEP}).rowcount
