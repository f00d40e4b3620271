"""Schedules (docs/contract.md#schedules): each workflow's schedule row, the ledger of its ticks,
and every decision about a tick, as SQL and transactions. The worker's scheduler, the API and the
CLI (and later a console page) all go through here.

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
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flowforge.cache import BoundedCache
from flowforge.domain.definitions import Definition, PriorityInvalid, Schedule, parse_schedule
from flowforge.domain.model import (
    LIVE_EXECUTION_SQL,
    EventKind,
    KeyOrigin,
    LedgerOutcome,
    Overlap,
    sql_list,
)
from flowforge.errors import ClientError, Conflict, FlowForgeError, NotFound
from flowforge.store import creation, flowcontrol
from flowforge.store.db import notify_relay, one
from flowforge.store.outbox import INSERT_WAKEUPS
from flowforge.usecases import actions, intake

logger = logging.getLogger(__name__)

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
# Then, for the claimed ticks only: the executions (a gated one holding its slot), their
# steps (roots ready), the root wake-ups and the history (the relay is notified after the
# commit, Scheduling.decide_due). Two
# statements rather than one: joining the claim's RETURNING back to its input inside one
# statement is a nested loop over two CTEs the planner cannot size (quadratic in the
# batch). Every tick not claimed is left to the caller, which decides it through the
# full intake (a refusal, a buffer, a replace, a replay, a stale target).
BATCH_CREATE = f"""
WITH accepted AS (
    SELECT * FROM jsonb_to_recordset(%(ticks)s::jsonb)
        AS t(id uuid, workflow_id bigint, version_id bigint, key text, input jsonb,
             ckey text, deadline_s float8, start_within_s float8, priority smallint)
), version AS (
    SELECT * FROM jsonb_to_recordset(%(versions)s::jsonb)
        AS v(version_id bigint, event jsonb, steps text[], types text[], roots bool[])
), step AS (
    SELECT v.version_id, s.step_id, s.type, s.root, s.position
    FROM version v, unnest(v.steps, v.types, v.roots) WITH ORDINALITY
        AS s(step_id, type, root, position)
), execution AS (
    INSERT INTO executions (id, workflow_id, version_id, status, input, idempotency_key,
                            concurrency_key, slot_at, deadline_at, expires_at, trigger,
                            priority)
    SELECT id, workflow_id, version_id, '{creation.QUEUED}', input, key, ckey,
           CASE WHEN ckey IS NOT NULL THEN now() END,
           now() + make_interval(secs => deadline_s),
           now() + make_interval(secs => start_within_s),
           'schedule', priority
    FROM accepted
), new_steps AS (
    INSERT INTO steps (execution_id, step_id, type, position, status, ready_at, ready_since,
                       priority)
    SELECT a.id, s.step_id, s.type, s.position,
           {creation.ROOT_READY},
           {creation.READY_AT}, {creation.READY_AT}, a.priority
    FROM accepted a JOIN step s ON s.version_id = a.version_id
), wakeups AS (
    {INSERT_WAKEUPS}
    SELECT a.id, s.step_id FROM accepted a JOIN step s ON s.version_id = a.version_id
    WHERE s.root
), history AS (
    INSERT INTO execution_events (execution_id, kind, detail)
    SELECT a.id, '{creation.QUEUED_KIND}', v.event FROM accepted a JOIN version v USING (version_id)
    UNION ALL
    SELECT id, '{EventKind.SLOT_GRANTED}', jsonb_build_object('key', ckey)
    FROM accepted WHERE ckey IS NOT NULL
)
SELECT count(*) FROM accepted
"""
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


@dataclass
class _Due:
    """A tick a pass found due to fire, its fate still to decide."""

    tick: datetime
    fires: datetime
    lag: timedelta


@dataclass
class _Plan:
    """One claimed schedule in a pass: its due ticks in order (decided, or _Due) and the
    tick after them."""

    key: str
    workflow_id: int
    schedule: Schedule
    items: list[TickOutcome | _Due] = field(default_factory=list)
    next_tick: datetime | None = None


@dataclass(frozen=True)
class Candidate:
    """A tick for fire_batch: the workflow's cached intake target, its schedule, the
    tick instant."""

    target: intake.Target
    schedule: Schedule
    tick: datetime


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


class Ticker:
    """Decides due ticks: the scheduler's one pass, and the operator's trigger and
    backfill. Holds a small cache of intake targets (re-checked by the intake statement)."""

    def __init__(self) -> None:
        self._targets = intake.UnsignedTargets()
        self._schedules: BoundedCache[tuple[str, int], Schedule] = BoundedCache(4096)

    def decide_due(self, conn: psycopg.Connection) -> list[TickOutcome] | None:
        """Claim up to CLAIM_BATCH due schedules and decide their due ticks (up to
        TICKS_PER_PASS each) in one transaction; None when no schedule is due.

        Set-based where it can be: the ticks every schedule would start anyway (overlap
        `allow`, or the first due tick of a gated schedule whose slot is free) are created
        by one statement (fire_batch); every other tick, and any the batch left, goes
        through the full intake one by one, after the batch and in tick order. The
        ledger rows and the next ticks are then written by one statement each.

        Holders replaced by `cancel_other` are stopped after the commit, each in its own
        transaction, as the webhook intake does (a row lock is never waited for while
        the slot lock is held)."""
        with conn.transaction():
            rows = conn.execute(CLAIM_DUE, {"limit": CLAIM_BATCH}).fetchall()
            if not rows:
                return None
            plans = [
                self._plan(
                    key, workflow_id, self._schedule(conn, version_id, spec), tick, paused, now
                )
                for workflow_id, version_id, key, spec, tick, paused, now in rows
            ]
            fired = self._fire_batched(conn, plans)
            decided: list[tuple[int, TickOutcome]] = []
            for plan in plans:
                for item in plan.items:
                    if isinstance(item, _Due):
                        outcome = fired.get(id(item)) or self._fire_one(conn, plan, item)
                    else:
                        outcome = item
                    decided.append((plan.workflow_id, outcome))
            conn.execute(INSERT_LEDGER_ALL, _ledger_rows(decided))
            conn.execute(ADVANCE_ALL, {"rows": json.dumps([_advance_row(p) for p in plans])})
        outcomes = [outcome for _, outcome in decided]
        _notify_if_fired(conn, outcomes)
        stop_replaced(conn, outcomes)
        return outcomes

    def _schedule(self, conn: psycopg.Connection, version_id: int, spec: Any) -> Schedule:
        """A version's schedule, parsed once per process (versions are immutable)."""
        slot = (conn.info.dbname, version_id)
        cached = self._schedules.get(slot)
        if cached is None:
            cached = parse_schedule(spec)
            self._schedules.put(slot, cached)
        return cached

    def _plan(
        self,
        key: str,
        workflow_id: int,
        schedule: Schedule,
        tick: datetime | None,
        paused: bool,
        now: datetime,
    ) -> _Plan:
        """One schedule's due ticks from `tick`, in order: the missed and paused ones
        decided, the others due to fire; and the next tick."""
        plan = _Plan(key, workflow_id, schedule)
        window = timedelta(seconds=schedule.catchup_window_s)
        span = timedelta(seconds=schedule.jitter_s)
        while tick is not None and len(plan.items) < TICKS_PER_PASS:
            fires = fire_time(workflow_id, schedule, tick)
            assert fires is not None
            if fires > now:
                break
            if now - fires > window:
                # Every tick up to now - window - span is late whatever its jitter.
                jump = schedule.next_after(max(tick, now - window - span))
                plan.items += self._missed(key, schedule, tick, jump)
                tick = jump
                continue
            if paused:
                plan.items.append(
                    TickOutcome(key, tick, LedgerOutcome.PAUSED, reason="schedule paused")
                )
            else:
                plan.items.append(_Due(tick, fires, now - fires))
            tick = schedule.next_after(tick)
        plan.next_tick = tick
        return plan

    def _fire_batched(self, conn: psycopg.Connection, plans: list[_Plan]) -> dict[int, TickOutcome]:
        """Fire in one statement the ticks of `plans` that start whatever the state of
        their slot allows (see fire_batch): every due tick of an `allow` schedule, the
        first due tick of a gated one. Workflows with their own `concurrency` are left to
        the full intake (a rendered key, a queue limit). Returns the fired outcomes by
        id() of their _Due."""
        candidates: list[Candidate] = []
        dues: list[tuple[_Plan, _Due]] = []
        for plan in plans:
            due = [item for item in plan.items if isinstance(item, _Due)]
            if not due:
                continue
            try:
                target = self._targets.get(conn, plan.key, False)
            except FlowForgeError:
                continue  # the full intake ledgers why
            if target.definition.concurrency is not None:
                continue
            for item in due if plan.schedule.overlap == Overlap.ALLOW else due[:1]:
                candidates.append(Candidate(target, plan.schedule, item.tick))
                dues.append((plan, item))
        if not candidates:
            return {}
        created = fire_batch(conn, candidates)
        return {
            id(item): TickOutcome(
                plan.key,
                item.tick,
                LedgerOutcome.FIRED,
                execution_id,
                None,
                item.lag.total_seconds(),
                fires_at=item.fires,
            )
            for (plan, item), execution_id in zip(dues, created, strict=True)
            if execution_id is not None
        }

    def _fire_one(self, conn: psycopg.Connection, plan: _Plan, due: _Due) -> TickOutcome:
        """A due tick through the full intake (Ticker.fire)."""
        try:
            outcome = self.fire(conn, plan.key, plan.workflow_id, plan.schedule, due.tick, due.lag)
            outcome.fires_at = due.fires
        except FlowForgeError as exc:
            # Refused before any statement ran (a workflow concurrency key the tick's
            # input cannot render, the workflow archived meanwhile): the tick is
            # ledgered, and the other schedules of the batch go on.
            outcome = TickOutcome(
                plan.key, due.tick, LedgerOutcome.SKIPPED, reason=f"not fired: {exc}"
            )
        return outcome

    @staticmethod
    def _missed(
        key: str, schedule: Schedule, first: datetime, end: datetime | None
    ) -> list[TickOutcome]:
        """Ledger the ticks from `first` up to (not including) `end` as missed: one row
        each up to MISSED_ROWS, else one row that says how many (a year of downtime of an
        `every_s: 1` schedule is one row, not thirty million)."""
        ticks: list[datetime] = []
        tick: datetime | None = first
        while tick is not None and (end is None or tick < end) and len(ticks) <= MISSED_ROWS:
            ticks.append(tick)
            tick = schedule.next_after(tick)
        reason = "older than the catch-up window"
        if len(ticks) <= MISSED_ROWS:
            outcomes = [TickOutcome(key, t, LedgerOutcome.MISSED, reason=reason) for t in ticks]
        else:
            if schedule.every_s is not None and end is not None:
                count = f"{-(-(end - first) // timedelta(seconds=schedule.every_s))} ticks"
            else:
                count = f"more than {MISSED_ROWS} ticks"
            upto = f" up to {iso(end)}" if end is not None else ""
            outcomes = [
                TickOutcome(
                    key,
                    first,
                    LedgerOutcome.MISSED,
                    reason=f"{count} from {iso(first)}{upto}: {reason}",
                )
            ]
        return outcomes

    def fire(
        self,
        conn: psycopg.Connection,
        key: str,
        workflow_id: int,
        schedule: Schedule,
        tick: datetime,
        lag: timedelta | None,
        *,
        overlap: Overlap | None = None,
    ) -> TickOutcome:
        """Create a tick's execution through the flow-control intake statement, under the
        overlap policy's slot (in the caller's transaction; the ledger row is the
        caller's). A tick that fired already is reported with its execution."""
        body = json.dumps(tick_input(schedule, tick)).encode()
        idempotency_key = tick_key(tick)
        policy = overlap or schedule.overlap
        lag_s = None if lag is None else lag.total_seconds()
        for fresh in (False, True):
            target = self._targets.get(conn, key, fresh)
            params = params_for(target, body, idempotency_key, policy)
            decision = gated_intake(conn, params)
            if not decision.current:
                continue
            if decision.mode == "refuse":
                return TickOutcome(
                    key,
                    tick,
                    LedgerOutcome.SKIPPED,
                    reason=self._why_skipped(conn, workflow_id, policy),
                )
            if not decision.created:
                existing = conn.execute(intake.EXISTING_KEY, params).fetchone()
                return TickOutcome(
                    key,
                    tick,
                    LedgerOutcome.SKIPPED,
                    execution_id=str(existing[1]) if existing else None,
                    reason="this tick fired already",
                )
            if decision.mode == "queue":
                return TickOutcome(
                    key,
                    tick,
                    LedgerOutcome.BUFFERED,
                    params["id"],
                    "waits for the live execution",
                    lag_s,
                )
            reason = None
            if decision.mode == "drop":
                reason = "cancelled by the workflow's concurrency (on_full drop_new)"
            elif decision.replaced:
                reason = "cancels " + ", ".join(decision.replaced)
            return TickOutcome(
                key, tick, LedgerOutcome.FIRED, params["id"], reason, lag_s, decision.replaced
            )
        raise Conflict(f"workflow {key!r} keeps changing; try again")

    @staticmethod
    def _why_skipped(conn: psycopg.Connection, workflow_id: int, policy: Overlap) -> str:
        live = conn.execute(LIVE, {"workflow_id": workflow_id}).fetchone()
        if policy == Overlap.BUFFER_ONE:
            return "a tick is already buffered behind the live execution"
        if policy == Overlap.SKIP:
            return f"execution {live[0]} is live (overlap skip)" if live else "overlap skip"
        return "the workflow's queue is full (concurrency.max_queued)"

    @staticmethod
    def _ledger(
        conn: psycopg.Connection, workflow_id: int, outcome: TickOutcome, actor: Any = None
    ) -> None:
        conn.execute(INSERT_LEDGER, _ledger_row(workflow_id, outcome, actor))

    def trigger(self, conn: psycopg.Connection, key: str, actor: dict[str, Any]) -> TickOutcome:
        """Fire a tick now, at the database's clock, under the overlap policy; ledgered
        with the operator who asked."""
        with conn.transaction():
            workflow_id, schedule, _, _, now = _locked(conn, key)
            outcome = self.fire(conn, key, workflow_id, schedule, now, None)
            if outcome.reason is None:
                outcome.reason = "triggered by an operator"
            self._ledger(conn, workflow_id, outcome, actor)
        _notify_if_fired(conn, [outcome])
        stop_replaced(conn, [outcome], actor)
        return outcome

    def backfill(
        self,
        conn: psycopg.Connection,
        key: str,
        start: datetime,
        end: datetime,
        *,
        dry_run: bool,
        actor: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """Fire every tick of the schedule in [start, end] (past instants only, at most
        MAX_BACKFILL_TICKS) that has not fired, as `allow` would: a backfill asks for each
        tick, and the workflow's own concurrency still applies. A dry run lists them."""
        with conn.transaction():
            workflow_id, schedule, _, _, now = _locked(conn, key)
            if end > now:
                raise BackfillInvalid("to must not be in the future: a backfill fires past ticks")
            ticks = ticks_between(schedule, start, end, MAX_BACKFILL_TICKS)
            if ticks is None:
                raise BackfillInvalid(
                    f"the range holds more than {MAX_BACKFILL_TICKS} ticks; backfill a shorter one"
                )
            items: list[dict[str, Any]] = []
            for tick in ticks:
                done = conn.execute(
                    FIRED_AT, {"workflow_id": workflow_id, "tick_at": tick}
                ).fetchone()
                if done is not None:
                    items.append(
                        {
                            "tick_at": iso(tick),
                            "outcome": "fired already",
                            "execution_id": str(done[0]),
                        }
                    )
                elif dry_run:
                    items.append(
                        {"tick_at": iso(tick), "outcome": "would fire", "execution_id": None}
                    )
                else:
                    outcome = self.fire(
                        conn, key, workflow_id, schedule, tick, None, overlap=Overlap.ALLOW
                    )
                    outcome.reason = outcome.reason or "backfill"
                    self._ledger(conn, workflow_id, outcome, actor)
                    items.append(outcome.view())
        if not dry_run:
            notify_relay(conn)
        return items


def _notify_if_fired(conn: psycopg.Connection, outcomes: list[TickOutcome]) -> None:
    """Wake the relays after the commit that created tick executions, never inside it:
    a NOTIFY in the commit serialises it with every other notifying commit (db.notify_relay).
    A lost one is found by the relay's poll."""
    if any(outcome.outcome == "fired" for outcome in outcomes):
        notify_relay(conn)


def fire_batch(conn: psycopg.Connection, candidates: list[Candidate]) -> list[str | None]:
    """Create the executions of many ticks in two statements (BATCH_CLAIM, BATCH_CREATE),
    in the caller's transaction: each tick's execution id, or None for a tick left to the
    full intake (its slot taken or queued for, its key claimed already, its target stale).

    Only for workflows without their own `concurrency`; a gated tick (overlap skip,
    buffer_one, cancel_other) starts only on a free slot, so never more than one per
    schedule should be passed (later ticks of one schedule would not see it)."""
    gated = [c.target.workflow_id for c in candidates if c.schedule.overlap.on_full]
    if gated:
        conn.execute(BATCH_SLOT_LOCKS, {"workflow_ids": gated})
    ticks: list[dict[str, Any]] = []
    versions: dict[int, dict[str, Any]] = {}
    for candidate in candidates:
        target, definition = candidate.target, candidate.target.definition
        if definition.concurrency is not None:
            raise ValueError("fire_batch takes workflows without their own concurrency")
        data = tick_input(candidate.schedule, candidate.tick)
        body = json.dumps(data).encode()
        try:
            priority = intake.priority_params(definition, body)["priority"]
        except PriorityInvalid:
            # Left to the full intake, which decides it as it decides any refusal.
            priority = None
        ticks.append(
            {
                "id": str(intake.uuid7()),
                "workflow_id": target.workflow_id,
                "version_id": target.version_id,
                "version": target.version,
                "key": tick_key(candidate.tick),
                "input": data,
                "body_sha256": hashlib.sha256(body).hexdigest(),
                "ckey": flowcontrol.SCHEDULE_KEY if candidate.schedule.overlap.on_full else None,
                "deadline_s": definition.deadline_s,
                "start_within_s": definition.start_within_s,
                "priority": priority,
            }
        )
        if target.version_id not in versions:
            roots = set(definition.roots())
            versions[target.version_id] = {
                "version_id": target.version_id,
                "event": json.loads(target.steps["event"]),
                "steps": [step.id for step in definition.steps],
                "types": [step.type for step in definition.steps],
                "roots": [step.id in roots for step in definition.steps],
            }
    batch = [tick for tick in ticks if tick["priority"] is not None]
    claimed = {
        str(execution_id)
        for (execution_id,) in conn.execute(BATCH_CLAIM, {"ticks": json.dumps(batch)})
    }
    accepted = [tick for tick in ticks if tick["id"] in claimed]
    if accepted:
        params = {
            "ticks": json.dumps(accepted),
            "versions": json.dumps(list(versions.values())),
        }
        conn.execute(BATCH_CREATE, params)
    return [tick["id"] if tick["id"] in claimed else None for tick in ticks]


def _advance_row(plan: _Plan) -> dict[str, Any]:
    """ADVANCE_ALL's row for a schedule a pass decided."""
    fires = fire_time(plan.workflow_id, plan.schedule, plan.next_tick)
    return {
        "workflow_id": plan.workflow_id,
        "next_tick_at": plan.next_tick.isoformat() if plan.next_tick else None,
        "fire_at": fires.isoformat() if fires else None,
    }


def _ledger_rows(decided: list[tuple[int, TickOutcome]]) -> dict[str, Any]:
    """INSERT_LEDGER_ALL's parameters for a pass's outcomes, in order."""
    rows = [
        {
            "workflow_id": workflow_id,
            "tick_at": o.tick_at.isoformat(),
            "outcome": o.outcome,
            "execution_id": o.execution_id,
            "reason": o.reason,
            # Only ticks that created an execution have a lag.
            "fires_at": o.fires_at.isoformat() if o.lag_s is not None and o.fires_at else None,
        }
        for workflow_id, o in decided
    ]
    return {"rows": json.dumps(rows)}


def _ledger_row(workflow_id: int, outcome: TickOutcome, actor: Any = None) -> dict[str, Any]:
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


def gated_intake(conn: psycopg.Connection, params: dict[str, Any]) -> flowcontrol.Decision:
    """flowcontrol.create's statement and locks, in the caller's transaction and without
    a savepoint (a tick's intake commits with its ledger row); mode `refuse` is returned,
    not raised: for a tick it is the overlap policy's skip."""
    if params["ckey"] is not None:
        if params["max_queued"] is not None:
            conn.execute(flowcontrol.QUEUE_LOCK, params)
        conn.execute(flowcontrol.SLOT_LOCK, params)
    current, created, mode, oldest, _ = one(conn.execute(flowcontrol.GATED_INTAKE, params))
    replaced = tuple(oldest) if mode == "replace" else ()
    return flowcontrol.Decision(bool(current), bool(created), mode, replaced)


def params_for(target: intake.Target, body: bytes, key: str, overlap: Overlap) -> dict[str, Any]:
    """The flow-control intake parameters of a tick: the webhook intake's (intake.accept),
    with trigger `schedule` and the overlap policy's slot in place of the workflow's
    concurrency for skip, buffer_one and cancel_other."""
    params: dict[str, Any] = {
        "id": str(intake.uuid7()),
        "workflow_id": target.workflow_id,
        "version_id": target.version_id,
        "version": target.version,
        "secret_id": None,
        "input": body.decode(),
        "key": key,
        # The scheduler's own key space: no webhook's key can claim a tick
        # (docs/contract.md#system-keys).
        "key_origin": KeyOrigin.SYSTEM.value,
        "body_sha256": hashlib.sha256(body).digest(),
        **intake.INTAKE_PARAMS,
        **target.steps,
        **flowcontrol.intake_params(target.definition, body),
        **intake.priority_params(target.definition, body),
        "trigger": "schedule",
    }
    if overlap.on_full:
        params.update(
            ckey=flowcontrol.SCHEDULE_KEY, limit=1, on_full=overlap.on_full, max_queued=None
        )
    return params


def stop_replaced(
    conn: psycopg.Connection, outcomes: list[TickOutcome], actor: dict[str, Any] = SCHEDULER
) -> None:
    """Stop the executions `cancel_other` replaced, by the cancel rules (a request in
    flight finishes and is recorded), in the name of `actor`."""
    for outcome in outcomes:
        actions.stop_replaced(conn, outcome.replaced, actor=actor)


def ticks_between(
    schedule: Schedule, start: datetime, end: datetime, cap: int
) -> list[datetime] | None:
    """The tick instants in [start, end]; None when there are more than `cap`."""
    ticks: list[datetime] = []
    tick = schedule.next_after(start - timedelta(microseconds=1))
    while tick is not None and tick <= end:
        if len(ticks) == cap:
            return None
        ticks.append(tick)
        tick = schedule.next_after(tick)
    return ticks


def _locked(
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
        workflow_id, _, _, paused_at, now = _locked(conn, key)
        if (paused_at is not None) != paused:
            conn.execute(
                SET_PAUSED,
                {
                    "workflow_id": workflow_id,
                    "paused_at": now if paused else None,
                    "actor": Jsonb(actor) if paused else None,
                },
            )
            Ticker._ledger(
                conn,
                workflow_id,
                TickOutcome(
                    key,
                    now,
                    LedgerOutcome.PAUSE if paused else LedgerOutcome.RESUME,
                    reason="by an operator",
                ),
                actor,
            )
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
