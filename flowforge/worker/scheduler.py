"""The scheduler: decides due schedule ticks (docs/contract.md#schedules) and starts due debounce
and batch groups (docs/contract.md#debounce-batch). Every worker runs one; they coordinate through
PostgreSQL alone (ticks.Ticker: due rows claimed FOR UPDATE SKIP LOCKED, each tick's execution
claimed by its idempotency key in the intake statement; grouping.Starter: a due group claimed FOR
UPDATE SKIP LOCKED, started and marked in one transaction).

A pass decides due schedules one transaction each until none is due (or BATCH were),
then sleeps until the next fire time the index knows, at most MAX_SLEEP — so a tick
fires within a few milliseconds of its time when the database keeps up, and a new
schedule published meanwhile waits at most MAX_SLEEP.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg_pool

from flowforge.observe import metrics
from flowforge.store import schedules
from flowforge.store.db import one, wrap_exceptions
from flowforge.usecases import grouping, ticks
from flowforge.worker.loop import Loop

logger = logging.getLogger(__name__)

BATCH = 500
MAX_SLEEP = 1.0
MIN_SLEEP = 0.005
TRIM_SECONDS = 60.0
# How long until the next schedule fires, through schedules_due.
NEXT_FIRE = (
    "SELECT extract(epoch FROM min(fire_at) - now()) FROM schedules WHERE fire_at IS NOT NULL"
)


class Scheduler(Loop):
    """Fires, skips, buffers or ledgers every due tick; trims the ledger once a minute."""

    interval = MAX_SLEEP

    def __init__(self, pool: psycopg_pool.ConnectionPool, stop: threading.Event) -> None:
        super().__init__("scheduler", stop)
        self.pool = pool
        self.ticker = ticks.Ticker()
        self.starter = grouping.Starter()
        self._trimmed_at = 0.0

    def step(self) -> float:
        decided, pause = self.scan()
        return 0.0 if decided >= BATCH else pause

    def scan(self) -> tuple[int, float]:
        """Decide up to BATCH due schedules and start up to grouping.START_BATCH due
        groups; returns how many and how long to sleep."""
        decided = 0
        with wrap_exceptions(), self.pool.connection() as conn:
            while decided < BATCH and not self.stop.is_set():
                outcomes = self.ticker.decide_due(conn)
                if outcomes is None:
                    break
                decided += 1
                for outcome in outcomes:
                    record(outcome)
            if time.monotonic() - self._trimmed_at >= TRIM_SECONDS:
                trimmed = schedules.trim(conn)
                self._trimmed_at = time.monotonic()
                if trimmed:
                    logger.info("schedule ledger trimmed", extra={"count": trimmed})
            started = 0
            while started < grouping.START_BATCH and not self.stop.is_set():
                group = self.starter.start_one(conn)
                if group is None:
                    break
                started += 1
                record_group(group)
            (seconds,) = one(conn.execute(NEXT_FIRE))
            due = grouping.next_due(conn)
        if started >= grouping.START_BATCH:
            decided = max(decided, BATCH)  # a backlog of groups: go on at once
        waits = [float(x) for x in (seconds, due) if x is not None]
        if not waits:
            return decided, MAX_SLEEP
        return decided, min(MAX_SLEEP, max(MIN_SLEEP, min(waits)))


def record(outcome: schedules.TickOutcome) -> None:
    """The one place a tick's outcome and lag are reported, after its commit: the log line,
    flowforge_schedule_ticks_total{outcome} (one per ledger row, so a summary row of many
    missed ticks counts once) and flowforge_schedule_lag_seconds for ticks that started
    an execution."""
    metrics.TICKS[outcome.outcome].inc()
    if outcome.lag_s is not None:
        metrics.SCHEDULE_LAG.observe(outcome.lag_s)
    logger.info(
        "schedule tick %s",
        outcome.outcome,
        extra={
            "workflow": outcome.workflow,
            "tick_at": schedules.iso(outcome.tick_at),
            "outcome": outcome.outcome,
            "execution_id": outcome.execution_id,
            "lag_s": outcome.lag_s,
        },
    )


def record_group(group: grouping.Started) -> None:
    """A due group's outcome, after its commit: the log line and
    flowforge_intake_groups_total{kind,outcome}."""
    metrics.INTAKE_GROUPS.labels(group.kind, group.outcome).inc()
    logger.info(
        "intake group %s",
        group.outcome,
        extra={
            "workflow": group.workflow,
            "group_id": group.group_id,
            "kind": group.kind,
            "execution_id": group.execution_id,
            "events": group.events,
            "reason": group.reason,
        },
    )
