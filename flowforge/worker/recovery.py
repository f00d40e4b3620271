"""Lease recovery: a step whose lease ran out is recovered by the engine's rules (SPEC §7).

A lapsed pure step goes back to `ready`; a lapsed http_request may have sent its request,
so it becomes `unknown` unless its definition says a retry is safe. One execution per
transaction, and one that cannot be recovered is set aside instead of blocking the rest.
"""

from __future__ import annotations

import logging

import psycopg
import psycopg_pool

from flowforge.db import wrap_exceptions
from flowforge.errors import DatabaseUnavailable
from flowforge.model import StepStatus
from flowforge.runs import load_run, save_run, unit_of_work

logger = logging.getLogger(__name__)

EXPIRED = """
SELECT execution_id, step_id FROM steps
WHERE status = 'running' AND lease_expires_at < now()
ORDER BY lease_expires_at LIMIT 100
"""
# Locks the lapsed step's row and confirms, on its newest version, that the lease is still
# the one read and still expired. A renewal that was in flight when the steps were read
# either committed first (then this finds no row: the lease is live) or waits for this
# transaction and then finds the step no longer running under its token.
LOCK_LAPSED = """
SELECT 1 FROM steps
WHERE execution_id = %(id)s AND step_id = %(step)s AND status = 'running'
  AND fencing_token = %(token)s AND lease_expires_at < now()
FOR UPDATE
"""
# A step whose recovery failed (a bug, a row no code path should have written) moves to
# the back of the queue for this long, instead of failing first in every pass.
SET_ASIDE_S = 300.0
SET_ASIDE = """
UPDATE steps SET lease_expires_at = now() + make_interval(secs => %(after_s)s)
WHERE execution_id = %(id)s AND step_id = %(step)s AND status = 'running'
  AND lease_expires_at < now()
"""


class LeaseRecovery:
    """Recovers the expired leases of workers that died or froze."""

    def __init__(self, pool: psycopg_pool.ConnectionPool) -> None:
        self.pool = pool

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
                    with wrap_exceptions():
                        self._recover(conn, eid, step_id)
                except DatabaseUnavailable:
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
            lapsed = {"id": execution_id, "step": step_id, "token": state.fencing_token}
            if conn.execute(LOCK_LAPSED, lapsed).fetchone() is None:
                return  # renewed while we read the steps
            logger.warning(
                "recovering expired lease",
                extra={"execution_id": execution_id, "step": step_id, "owner": state.lease_owner},
            )
            run.recover_lease(step_id)
            save_run(conn, run.take_changes())
