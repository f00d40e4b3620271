"""The delay-timer scanner: due `waiting` steps become `ready`, with their wake-ups, and
due deadlines and queue expiries (timelimits) stop their executions.

One statement per batch, driven by the partial index on steps(wake_at) WHERE
status = 'waiting', so a million sleeping delays cost nothing until they are due. It
locks the executions first (SKIP LOCKED), like every other writer, so it never waits on
a checkpoint in progress and can never deadlock with one.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg_pool
from psycopg.types.json import Jsonb

from flowforge.domain.model import ExecutionStatus, StepStatus, execution_moved, step_moved
from flowforge.observe import metrics
from flowforge.store import outbound
from flowforge.store.db import notify_relay, one, wrap_exceptions
from flowforge.store.outbox import INSERT_WAKEUPS
from flowforge.usecases import timelimits
from flowforge.worker.loop import Loop

logger = logging.getLogger(__name__)

BATCH = 500
MAX_SLEEP = 1.0
MIN_SLEEP = 0.05

# The transitions are the engine's (model.py): a due step `waiting -> ready`, its execution
# `waiting -> running` (what Run.derive_status says of a run with a ready step), each with
# the history entry Run.set_step / Run.derive_status would append. A paused execution's
# due step becomes ready too, but with no wake-up and the execution left `paused`: resume
# dispatches its ready steps (docs/contract.md#pause). The values written are
# parameters (WAKE_PARAMS); the `status = 'waiting'` filters stay literal so that they
# match the partial index steps_waiting.
WAKE_DUE = f"""
WITH due AS (
    SELECT s.execution_id, s.step_id, e.status = 'paused' AS paused
    FROM steps s JOIN executions e ON e.id = s.execution_id
    WHERE s.status = 'waiting' AND s.wake_at <= now()
    ORDER BY s.wake_at
    LIMIT %(limit)s
    FOR UPDATE OF e SKIP LOCKED
), woken AS (
    UPDATE steps s SET status = %(ready)s, ready_at = now(), ready_since = now()
    FROM due WHERE s.execution_id = due.execution_id AND s.step_id = due.step_id
      AND s.status = 'waiting'
    RETURNING s.execution_id, s.step_id, extract(epoch FROM now() - s.wake_at) AS lag,
              due.paused
), resumed AS (
    UPDATE executions e SET status = %(running)s, updated_at = now()
    WHERE e.id IN (SELECT execution_id FROM woken) AND e.status = 'waiting'
    RETURNING e.id
), history AS (
    INSERT INTO execution_events (execution_id, step_id, kind, detail)
    SELECT execution_id, step_id, %(step_kind)s, %(step_detail)s::jsonb FROM woken
    UNION ALL
    SELECT id, NULL, %(execution_kind)s, %(execution_detail)s::jsonb FROM resumed
), wakeups AS (
    {INSERT_WAKEUPS} SELECT execution_id, step_id FROM woken WHERE NOT paused
)
SELECT count(*), array_agg(lag) FROM woken
"""
_WOKEN = step_moved(StepStatus.WAITING, StepStatus.READY)
_RESUMED = execution_moved(ExecutionStatus.WAITING, ExecutionStatus.RUNNING)
WAKE_PARAMS = {
    "ready": StepStatus.READY.value,
    "running": ExecutionStatus.RUNNING.value,
    "step_kind": _WOKEN[0],
    "step_detail": Jsonb(_WOKEN[1]),
    "execution_kind": _RESUMED[0],
    "execution_detail": Jsonb(_RESUMED[1]),
}
# How long the scanner may sleep: until the next wake_at, found through the index.
# Epochs, not an interval: a wake_at of 'infinity' (written by hand) has an epoch but no
# interval to now().
NEXT_DUE = """
SELECT extract(epoch FROM min(wake_at)) - extract(epoch FROM now())
FROM steps WHERE status = 'waiting'
"""


WAKE_LIMITED = outbound.WAKE_LIMITED.format(insert_wakeups=INSERT_WAKEUPS)


class TimerScanner(Loop):
    """Moves due delays and retry back-offs to `ready`."""

    interval = MAX_SLEEP

    def __init__(self, pool: psycopg_pool.ConnectionPool, stop: threading.Event) -> None:
        super().__init__("timers", stop)
        self.pool = pool
        self._soon = threading.Event()
        self._soon_at = float("inf")
        self._soon_lock = threading.Lock()

    def wake_in(self, seconds: float) -> None:
        """Pass again in `seconds` at the latest: a step that waits for an outbound limit
        (docs/contract.md#outbound-limits) must leave at its place, not up to MAX_SLEEP later, or
        the late ones would leave together, faster than the limit."""
        with self._soon_lock:
            self._soon_at = min(self._soon_at, time.monotonic() + max(0.0, seconds))
        self._soon.set()

    def step(self) -> float:
        woken, pause = self.scan()
        if woken >= BATCH:
            return 0.0
        deadline = time.monotonic() + pause
        while not self.stop.is_set():
            with self._soon_lock:
                until = min(deadline, self._soon_at)
            left = until - time.monotonic()
            if left <= 0:
                break
            self._soon.wait(min(left, MAX_SLEEP))
            self._soon.clear()
        with self._soon_lock:
            if self._soon_at <= time.monotonic():
                self._soon_at = float("inf")
        return 0.0

    def scan(self) -> tuple[int, float]:
        """Wake one batch; returns how many woke and how long to sleep next."""
        with wrap_exceptions(), self.pool.connection() as conn:
            with conn.transaction():
                (woken, lags) = one(conn.execute(WAKE_DUE, {"limit": BATCH, **WAKE_PARAMS}))
            # Steps that waited for an outbound limit (docs/contract.md#outbound-limits): their
            # wake-ups.
            with conn.transaction():
                (limited,) = one(
                    conn.execute(WAKE_LIMITED, {"limit": BATCH, "grace_s": outbound.LOCAL_GRACE_S})
                )
            if woken or limited:
                # After the commits, never inside them (db.notify_relay); a lost one is
                # found by the relay's poll.
                notify_relay(conn)
            # Deadlines and queue expiry: due rows too, checked every pass (at most MAX_SLEEP).
            timelimits.apply_due(conn)
            (seconds,) = one(conn.execute(NEXT_DUE))
            (limited_next,) = one(conn.execute(outbound.NEXT_LIMITED))
        if limited_next is not None:
            seconds = limited_next if seconds is None else min(seconds, limited_next)
        woken += limited
        if woken:
            logger.info("delays due", extra={"woken": woken})
            for lag in lags or ():  # due -> woken, both by PostgreSQL's clock
                metrics.TIMER_LAG.observe(max(0.0, float(lag)))
        if seconds is None:
            return woken, MAX_SLEEP
        return woken, min(MAX_SLEEP, max(MIN_SLEEP, float(seconds)))
