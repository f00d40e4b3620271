"""Run deadlines and queue expiry (docs/contract.md#deadline): durable wake times the timer
scanner applies.

`executions.deadline_at` and `expires_at` are written at intake; partial indexes hold
only executions they can still stop, so waiting costs nothing until one is due. Each
due execution is stopped in its own unit of work by the cancel rules (actions.stop),
so one that cannot be stopped never holds up the others.
"""

from __future__ import annotations

import logging

import psycopg

from flowforge.domain.model import (
    FLOW_CONTROL_ACTOR,
    LIVE_EXECUTION_SQL,
    ExecutionStatus,
    sql_list,
)
from flowforge.errors import DatabaseUnavailable
from flowforge.store.db import wrap_exceptions
from flowforge.usecases import actions

logger = logging.getLogger(__name__)

BATCH = 100

# Executions whose deadline passed and that were not stopped yet (executions_deadline).
DEADLINES_DUE = f"""
SELECT id FROM executions
WHERE deadline_at <= now() AND deadline_at IS NOT NULL AND cancel_requested_at IS NULL
  AND status IN {LIVE_EXECUTION_SQL}
ORDER BY deadline_at LIMIT %(limit)s
"""
# Executions still queued after start_within_s, or paused while queued (executions_expiry).
EXPIRABLE = (ExecutionStatus.QUEUED, ExecutionStatus.PAUSED)
EXPIRIES_DUE = f"""
SELECT id FROM executions
WHERE expires_at <= now() AND expires_at IS NOT NULL AND status IN {sql_list(EXPIRABLE)}
  AND (status = 'queued' OR paused_from = 'queued') AND cancel_requested_at IS NULL
ORDER BY expires_at LIMIT %(limit)s
"""


def apply_due(conn: psycopg.Connection) -> int:
    """Stop every execution whose deadline or queue expiry is due; returns how many."""
    stopped = 0
    for statement, reason in ((DEADLINES_DUE, "deadline"), (EXPIRIES_DUE, "expired")):
        for (execution_id,) in conn.execute(statement, {"limit": BATCH}).fetchall():
            eid = str(execution_id)
            try:
                # Locked (by a session frozen inside a unit of work): the next pass retries.
                with wrap_exceptions():
                    stopped_now = actions.stop(
                        conn, eid, reason, actor=FLOW_CONTROL_ACTOR, skip_locked=True
                    )
                if stopped_now is not None:
                    stopped += 1
                    logger.info("time limit applied", extra={"execution_id": eid, "reason": reason})
            except DatabaseUnavailable:
                raise  # the database is gone: the scanner's pass ends, not just this one
            except Exception:
                # One execution that cannot be stopped must not stop the others.
                logger.exception(
                    "time limit could not be applied", extra={"execution_id": eid, "reason": reason}
                )
    return stopped
