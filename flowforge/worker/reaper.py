"""Lease upkeep: the reaper recovers expired leases (the heartbeat that renews our own
lives in `leases.py`), and the reconciler re-dispatches ready work whose wake-up message
went missing.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import psycopg_pool

from flowforge.db import one, wrap_exceptions
from flowforge.errors import DatabaseUnavailable
from flowforge.model import StepStatus
from flowforge.outbox import INSERT_WAKEUPS, NOTIFY_OUTBOX
from flowforge.runs import load_run, save_run, unit_of_work

logger = logging.getLogger(__name__)

EXPIRED = """
SELECT execution_id, step_id FROM steps
WHERE status = 'running' AND lease_expires_at < now()
ORDER BY lease_expires_at LIMIT 100
"""
# Ready steps whose wake-up is neither in the outbox nor was dispatched recently: the
# message was lost (queue purged, broker reset). Dispatch them again — each time after
# twice as long (up to 2**MAX_DOUBLINGS intervals), since a step re-dispatched without any
# progress is a wake-up that keeps failing, and the dead-letter queue should get it
# rarely, not every interval forever. Returns how many had been re-dispatched before.
REDISPATCH = f"""
WITH stale AS (
    SELECT s.execution_id, s.step_id, s.redispatches FROM steps s
    WHERE s.status = 'ready'
      AND s.ready_at < now() - make_interval(secs => %(after_s)s)
      AND s.ready_at < now() - make_interval(
              secs => %(after_s)s * 2 ^ least(s.redispatches, %(max_doublings)s))
      AND NOT EXISTS (SELECT 1 FROM outbox o
                      WHERE o.execution_id = s.execution_id AND o.step_id = s.step_id)
    ORDER BY s.ready_at LIMIT 1000
    FOR UPDATE OF s SKIP LOCKED
), touched AS (
    UPDATE steps s SET ready_at = now(), redispatches = s.redispatches + 1 FROM stale
    WHERE s.execution_id = stale.execution_id AND s.step_id = stale.step_id
), sent AS (
    {INSERT_WAKEUPS} SELECT execution_id, step_id FROM stale
)
SELECT count(*), count(*) FILTER (WHERE redispatches > 0) FROM stale
"""
MAX_DOUBLINGS = 7
# A step whose recovery failed (a bug, a row no code path should have written) moves to
# the back of the queue for this long, instead of failing first in every pass.
SET_ASIDE_S = 300.0
SET_ASIDE = """
UPDATE steps SET lease_expires_at = now() + make_interval(secs => %(after_s)s)
WHERE execution_id = %(id)s AND step_id = %(step)s AND status = 'running'
  AND lease_expires_at < now()
"""
HOUSEKEEPING_SECONDS = 60.0
HOUSEKEEPING_BUDGET_S = 5.0
FORGET_BATCH = 10_000
# One batch of keys past their 24 hours, oldest first through idempotency_keys_by_age.
FORGET_IDEMPOTENCY_KEYS = """
DELETE FROM idempotency_keys
WHERE ctid = ANY(ARRAY(SELECT ctid FROM idempotency_keys
                       WHERE created_at < now() - interval '24 hours'
                       ORDER BY created_at LIMIT %(limit)s))
"""


class Reaper(threading.Thread):
    """Recovers expired leases, re-dispatches lost wake-ups, forgets old idempotency keys."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        *,
        lease_s: float,
        reconcile_s: float,
        stop: threading.Event,
    ) -> None:
        super().__init__(name="reaper", daemon=True)
        self.pool = pool
        self.lease_s = lease_s
        self.reconcile_s = reconcile_s
        self.stop = stop
        self._housekept_at = 0.0

    def run(self) -> None:
        interval = max(0.2, min(self.lease_s, self.reconcile_s) / 4)
        while not self.stop.wait(interval):
            self.run_pass()

    def run_pass(self) -> None:
        """Reap, reconcile, housekeep: each on its own, so one that fails starves no other."""
        for phase in (self.reap, self.reconcile, self.housekeep):
            try:
                phase()
            except (DatabaseUnavailable, psycopg.OperationalError) as exc:
                logger.warning(
                    "reaper phase failed", extra={"phase": phase.__name__, "error": str(exc)[:200]}
                )
            except Exception:
                logger.exception("reaper phase crashed; retrying", extra={"phase": phase.__name__})

    def reap(self) -> int:
        """Recover every expired lease, one execution per transaction.

        An execution whose recovery fails for any reason but an outage is logged and set
        aside for SET_ASIDE_SECONDS, so it neither stops the others in this pass nor comes
        first again in the next one.
        """
        with wrap_exceptions(), self.pool.connection() as conn:
            expired = conn.execute(EXPIRED).fetchall()
            for execution_id, step_id in expired:
                eid = str(execution_id)
                try:
                    self._recover(conn, eid, step_id)
                except psycopg.OperationalError:
                    raise
                except Exception:
                    logger.exception(
                        "lease recovery failed; set aside, retried later",
                        extra={"execution_id": eid, "step": step_id, "retry_in_s": SET_ASIDE_S},
                    )
                    conn.execute(SET_ASIDE, {"id": eid, "step": step_id, "after_s": SET_ASIDE_S})
        return len(expired)

    def _recover(self, conn: psycopg.Connection, execution_id: str, step_id: str) -> None:
        with unit_of_work(conn):
            run = load_run(conn, execution_id)
            if run is None:
                return
            state = run.steps[step_id]
            if not state.lease_expired or state.status != StepStatus.RUNNING:
                return  # renewed or finished since we looked
            logger.warning(
                "recovering expired lease",
                extra={"execution_id": execution_id, "step": step_id, "owner": state.lease_owner},
            )
            run.recover_lease(step_id)
            save_run(conn, run.take_changes())

    def reconcile(self) -> int:
        """Re-dispatch ready steps whose message went missing."""
        with wrap_exceptions(), self.pool.connection() as conn, conn.transaction():
            count, again = one(
                conn.execute(
                    REDISPATCH, {"after_s": self.reconcile_s, "max_doublings": MAX_DOUBLINGS}
                )
            )
            if count:
                conn.execute(NOTIFY_OUTBOX)
                logger.warning(
                    "re-dispatched ready steps with lost wake-ups",
                    extra={"count": count, "again_without_progress": again},
                )
        return int(count)

    def housekeep(self) -> int:
        """Forget idempotency keys older than 24 hours, once a minute, until caught up.

        An unfinished backlog (see forget_expired_keys) goes on in the next pass instead
        of waiting a minute. Returns how many keys were forgotten.
        """
        if time.monotonic() - self._housekept_at < HOUSEKEEPING_SECONDS:
            return 0
        forgotten, caught_up = self.forget_expired_keys()
        if caught_up:
            self._housekept_at = time.monotonic()
        if forgotten:
            logger.info("forgot old idempotency keys", extra={"count": forgotten})
        return forgotten

    def forget_expired_keys(self) -> tuple[int, bool]:
        """Delete expired keys batch after batch; returns how many and whether caught up.

        One batch per statement keeps each delete's locks short; batches follow each other
        until one comes back short, so cleanup keeps up with any intake rate the database
        can delete at. At most HOUSEKEEPING_BUDGET_S per call, so reaping never waits long
        behind a backlog.
        """
        started = time.monotonic()
        forgotten = 0
        with wrap_exceptions(), self.pool.connection() as conn:
            while not self.stop.is_set():
                deleted = conn.execute(FORGET_IDEMPOTENCY_KEYS, {"limit": FORGET_BATCH}).rowcount
                forgotten += deleted
                if deleted < FORGET_BATCH:
                    return forgotten, True
                if time.monotonic() - started > HOUSEKEEPING_BUDGET_S:
                    break
        return forgotten, False
