"""Lease recovery: a step whose lease ran out is recovered by the engine's rules
(docs/contract.md#leases).

A lapsed pure step goes back to `ready`; a lapsed http_request may have sent its request,
so it becomes `unknown` unless its definition says a retry is safe. One execution per
transaction, and one that cannot be recovered is set aside instead of blocking the rest;
after a few failed tries its step is settled as `unknown`, for an operator to decide.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import psycopg_pool
from psycopg.types.json import Jsonb

from flowforge.domain.failures import Failure, group_step, signature
from flowforge.domain.model import (
    TERMINAL_EXECUTION,
    WORKER_DEAD_AFTER_S,
    AttemptOutcome,
    ExecutionStatus,
    FailureOutcome,
    StepStatus,
    execution_moved,
    step_moved,
)
from flowforge.errors import DatabaseUnavailable
from flowforge.store import failures
from flowforge.store.db import wrap_exceptions
from flowforge.store.runs import load_run, save_run, unit_of_work

logger = logging.getLogger(__name__)

# A worker whose liveness row is older than WORKER_DEAD_AFTER_S is dead (killed, its host
# lost): its row goes, and its live leases are made expired now, for the pass below to
# recover like any other. Such a worker, if only frozen, sends nothing when it wakes: its
# own liveness deadline (leases.Liveness) passed long before.
EXPIRE_DEAD_WORKERS = """
WITH dead AS (
    DELETE FROM worker_heartbeats
    WHERE beat_at < now() - make_interval(secs => %(dead_after_s)s)
    RETURNING worker_id
)
UPDATE steps s SET lease_expires_at = now() - interval '1 second'
FROM dead
WHERE s.status = 'running' AND s.lease_owner = dead.worker_id AND s.lease_expires_at > now()
RETURNING s.execution_id, s.step_id, dead.worker_id
"""
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
UPDATE steps SET lease_expires_at = now() + make_interval(secs => %(after_s)s),
                 recovery_failures = recovery_failures + 1
WHERE execution_id = %(id)s AND step_id = %(step)s AND status = 'running'
  AND lease_expires_at < now()
RETURNING recovery_failures
"""
# After this many failed recoveries the step is settled without the engine: set aside for
# ever, it would stay running with no owner, out of sight of needs_attention, and keep its
# execution running through a cancel.
MAX_RECOVERY_FAILURES = 3
# Settling, in plain SQL since the Run cannot be loaded: the execution row first (the lock
# order of runs.py), then the step, its open attempt and the history.
LOCK_EXECUTION_STATUS = "SELECT status FROM executions WHERE id = %(id)s FOR UPDATE"
SETTLE_STEP = """
UPDATE steps SET status = 'unknown', error = %(error)s, lease_owner = NULL,
                 lease_expires_at = NULL, finished_at = coalesce(finished_at, now())
WHERE execution_id = %(id)s AND step_id = %(step)s AND status = 'running'
  AND recovery_failures >= %(max_failures)s
RETURNING fencing_token
"""
SETTLE_EXECUTION = f"""
WITH {failures.UPSERT_CTE.strip()}
UPDATE executions SET status = 'needs_attention', updated_at = now(), finished_at = NULL,
                      failure_group_id = (SELECT id FROM failure_group)
WHERE id = %(execution_id)s
"""
# Closes only the attempt that holds this fencing token and is still open.
FINISH_ATTEMPT = """
UPDATE attempts SET finished_at = clock_timestamp(), outcome = %(outcome)s, error = %(error)s,
                    http_status = %(http_status)s, duration_ms = %(duration_ms)s,
                    response = %(response)s
WHERE execution_id = %(execution_id)s AND step_id = %(step_id)s
  AND fencing_token = %(fencing_token)s AND outcome IS NULL
"""
INSERT_EVENT = """
INSERT INTO execution_events (execution_id, step_id, kind, detail)
VALUES (%(execution_id)s, %(step_id)s, %(kind)s, %(detail)s)
"""


class LeaseRecovery:
    """Recovers the expired leases of workers that died or froze."""

    def __init__(self, pool: psycopg_pool.ConnectionPool) -> None:
        self.pool = pool

    def reap(self) -> int:
        """Recover every expired lease, one execution per transaction.

        An execution whose recovery fails for any reason but an outage is logged and set
        aside for SET_ASIDE_S, so it neither stops the others in this pass nor comes first
        again in the next one; the MAX_RECOVERY_FAILURES-th failure settles the step.
        """
        with wrap_exceptions(), self.pool.connection() as conn:
            for eid, sid, worker in conn.execute(
                EXPIRE_DEAD_WORKERS, {"dead_after_s": WORKER_DEAD_AFTER_S}
            ):
                logger.warning(
                    "worker is silent: its lease is expired now",
                    extra={"execution_id": str(eid), "step": sid, "worker": worker},
                )
            expired = conn.execute(EXPIRED).fetchall()
            for execution_id, step_id in expired:
                eid = str(execution_id)
                try:
                    with wrap_exceptions():
                        self._recover(conn, eid, step_id)
                except DatabaseUnavailable:
                    raise
                except Exception as exc:
                    self._set_aside(conn, eid, step_id, exc)
        return len(expired)

    def _set_aside(
        self, conn: psycopg.Connection, execution_id: str, step_id: str, exc: Exception
    ) -> None:
        """Retry a failed recovery later; after MAX_RECOVERY_FAILURES, settle the step."""
        log = {"execution_id": execution_id, "step": step_id}
        row = conn.execute(
            SET_ASIDE, {"id": execution_id, "step": step_id, "after_s": SET_ASIDE_S}
        ).fetchone()
        failures = 0 if row is None else int(row[0])
        if failures < MAX_RECOVERY_FAILURES:
            logger.exception(
                "lease recovery failed; set aside, retried later",
                extra={**log, "retry_in_s": SET_ASIDE_S, "failures": failures},
            )
            return
        logger.exception(
            "lease recovery failed again; the step is settled as unknown",
            extra={**log, "failures": failures},
        )
        error = (
            f"lease expired and its recovery failed {failures} times"
            f" ({type(exc).__name__}); the request may have been sent: an operator must decide"
        )
        self._settle(conn, execution_id, step_id, error)

    def _settle(
        self, conn: psycopg.Connection, execution_id: str, step_id: str, error: str
    ) -> None:
        """Make the step `unknown` and its execution `needs_attention` without a Run."""
        ids = {"id": execution_id, "step": step_id}
        with conn.transaction():
            head = conn.execute(LOCK_EXECUTION_STATUS, ids).fetchone()
            settled = conn.execute(
                SETTLE_STEP, {**ids, "error": error, "max_failures": MAX_RECOVERY_FAILURES}
            ).fetchone()
            if head is None or settled is None:
                return  # recovered, claimed or finished meanwhile
            conn.execute(
                FINISH_ATTEMPT,
                {
                    "execution_id": execution_id,
                    "step_id": step_id,
                    "fencing_token": settled[0],
                    "outcome": AttemptOutcome.UNKNOWN,
                    "error": error,
                    "http_status": None,
                    "duration_ms": None,
                    "response": None,
                },
            )
            kind, detail = step_moved(StepStatus.RUNNING, StepStatus.UNKNOWN)
            events: list[tuple[str | None, str, dict[str, Any]]] = [
                (step_id, kind, {**detail, "error": error})
            ]
            previous = head[0]
            if previous != ExecutionStatus.NEEDS_ATTENTION and previous not in TERMINAL_EXECUTION:
                # docs/contract.md#failure-groups: counted into its group as the engine's
                # needs_attention is (runs.SAVE_RUN_FAILING), in the same statement.
                failure = Failure(
                    group_step(step_id), signature(FailureOutcome.UNKNOWN.value, error)
                )
                params = {"execution_id": execution_id, **failures.upsert_params(failure)}
                conn.execute(SETTLE_EXECUTION, params)
                status = ExecutionStatus.NEEDS_ATTENTION
                events.append((None, *execution_moved(previous, status)))
            for event_step, kind, detail in events:
                conn.execute(
                    INSERT_EVENT,
                    {
                        "execution_id": execution_id,
                        "step_id": event_step,
                        "kind": kind,
                        "detail": Jsonb(detail),
                    },
                )

    def _recover(self, conn: psycopg.Connection, execution_id: str, step_id: str) -> None:
        with unit_of_work(conn):
            # Locked by a session that froze inside a unit of work: skipped, and retried in
            # the next pass once the server's timeout has ended that session; waiting for
            # it would stop the recovery of every other execution.
            run = load_run(conn, execution_id, skip_locked=True, open_items=True, also=[step_id])
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
