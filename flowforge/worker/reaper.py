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

from flowforge.db import wrap_exceptions
from flowforge.errors import DatabaseUnavailable
from flowforge.executions import load_run, save_run, unit_of_work
from flowforge.outbox import NOTIFY_OUTBOX

logger = logging.getLogger(__name__)

EXPIRED = """
SELECT execution_id, step_id FROM steps
WHERE status = 'running' AND lease_expires_at < now()
ORDER BY lease_expires_at LIMIT 100
"""
# Ready steps whose wake-up is neither in the outbox nor was dispatched recently: the
# message was lost (queue purged, broker reset). Dispatch them again.
REDISPATCH = """
WITH stale AS (
    SELECT s.execution_id, s.step_id FROM steps s
    WHERE s.status = 'ready'
      AND s.ready_at < now() - make_interval(secs => %(after_s)s)
      AND NOT EXISTS (SELECT 1 FROM outbox o
                      WHERE o.execution_id = s.execution_id AND o.step_id = s.step_id)
    ORDER BY s.ready_at LIMIT 1000
    FOR UPDATE OF s SKIP LOCKED
), touched AS (
    UPDATE steps s SET ready_at = now() FROM stale
    WHERE s.execution_id = stale.execution_id AND s.step_id = stale.step_id
)
INSERT INTO outbox (execution_id, step_id) SELECT execution_id, step_id FROM stale
"""
HOUSEKEEPING_SECONDS = 60.0
FORGET_IDEMPOTENCY_KEYS = """
DELETE FROM idempotency_keys
WHERE ctid = ANY(ARRAY(SELECT ctid FROM idempotency_keys
                       WHERE created_at < now() - interval '24 hours' LIMIT 10000))
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
            try:
                self.reap()
                self.reconcile()
                self.housekeep()
            except (DatabaseUnavailable, psycopg.OperationalError) as exc:
                logger.warning("reaper pass failed", extra={"error": str(exc)[:200]})
            except Exception:
                logger.exception("reaper pass crashed; retrying")

    def reap(self) -> int:
        """Recover every expired lease, one execution per transaction."""
        with wrap_exceptions(), self.pool.connection() as conn:
            expired = conn.execute(EXPIRED).fetchall()
            for execution_id, step_id in expired:
                with unit_of_work(conn):
                    loaded = load_run(conn, str(execution_id))
                    if loaded is None:
                        continue
                    run, lapsed = loaded
                    if step_id not in lapsed or run.steps[step_id].status != "running":
                        continue  # renewed or finished since we looked
                    logger.warning(
                        "recovering expired lease",
                        extra={
                            "execution_id": str(execution_id),
                            "step": step_id,
                            "owner": run.steps[step_id].lease_owner,
                        },
                    )
                    run.recover_lease(step_id)
                    save_run(conn, run, lease_s=self.lease_s)
        return len(expired)

    def reconcile(self) -> int:
        """Re-dispatch ready steps whose message went missing."""
        with wrap_exceptions(), self.pool.connection() as conn, conn.transaction():
            count = conn.execute(REDISPATCH, {"after_s": self.reconcile_s}).rowcount
            if count:
                conn.execute(NOTIFY_OUTBOX)
                logger.warning(
                    "re-dispatched ready steps with lost wake-ups", extra={"count": count}
                )
        return count

    def housekeep(self) -> None:
        """Idempotency keys are kept 24 hours, then forgotten in batches, once a minute."""
        if time.monotonic() - self._housekept_at < HOUSEKEEPING_SECONDS:
            return
        self._housekept_at = time.monotonic()
        with wrap_exceptions(), self.pool.connection() as conn:
            conn.execute(FORGET_IDEMPOTENCY_KEYS)
