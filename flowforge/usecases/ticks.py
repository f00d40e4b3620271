"""Schedule ticks decided (docs/contract.md#schedules): the scheduler's pass, the operator's
trigger and backfill, over the statements of store/schedules.py.

How a tick is decided once, whatever the number of workers (the claim, the idempotency
key, the one transaction), is told where its statements are: store/schedules.py.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from flowforge.cache import BoundedCache
from flowforge.domain.definitions import PriorityInvalid, Schedule, parse_schedule
from flowforge.domain.model import (
    KeyOrigin,
    LedgerOutcome,
    Overlap,
)
from flowforge.errors import Conflict, FlowForgeError
from flowforge.store import creation, flowcontrol
from flowforge.store.db import notify_relay, one
from flowforge.store.schedules import (
    ADVANCE_ALL,
    BATCH_CLAIM,
    BATCH_SLOT_LOCKS,
    CLAIM_BATCH,
    CLAIM_DUE,
    FIRED_AT,
    INSERT_LEDGER,
    INSERT_LEDGER_ALL,
    LIVE,
    MAX_BACKFILL_TICKS,
    MISSED_ROWS,
    SCHEDULER,
    TICKS_PER_PASS,
    BackfillInvalid,
    TickOutcome,
    fire_time,
    iso,
    ledger_row,
    lock_schedule,
    tick_input,
    tick_key,
)
from flowforge.usecases import actions, intake


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
        conn.execute(INSERT_LEDGER, ledger_row(workflow_id, outcome, actor))

    def trigger(self, conn: psycopg.Connection, key: str, actor: dict[str, Any]) -> TickOutcome:
        """Fire a tick now, at the database's clock, under the overlap policy; ledgered
        with the operator who asked."""
        with conn.transaction():
            workflow_id, schedule, _, _, now = lock_schedule(conn, key)
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
            workflow_id, schedule, _, _, now = lock_schedule(conn, key)
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
        conn.execute(creation.BATCH_CREATE, params)
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
