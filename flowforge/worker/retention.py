"""Retention: finished executions are deleted once their workflow keeps them no longer.

docs/contract.md#retention. Each workflow's `retention_days` (default 30) is read from its newest
version, so publishing a shorter one shortens it for every execution of the workflow, old ones
included. An execution is deleted, with its steps, attempts, events and resumes (foreign
keys ON DELETE CASCADE, each reached through an index on execution_id), only when it is
`succeeded`, `failed` or `cancelled`, finished longer ago than that, has no `unknown`
step (also under a cancelled execution: what a remote system did is still unsettled),
and its idempotency key, if any, is forgotten: a duplicate webhook is answered with the
original execution for as long as the key is remembered (FLOWFORGE_IDEMPOTENCY_KEY_HOURS,
default 24, housekeeping.py).
`needs_attention` and live executions are never candidates.

Outbox rows are left alone: a finished execution rarely has one (the relay deletes each
row once the broker confirmed it), the outbox has no index on execution_id that could
find them without scanning it, and a wake-up for a deleted execution is acknowledged and
dropped by the executor ("wake-up for an unknown execution").

Debounce and batch groups (docs/contract.md#debounce-batch) that could not start (`failed`: the
workflow was archived first, its concurrency key did not render) are deleted with their events by
the same rule, counted from when they failed: retention_days, and never before their events'
idempotency keys expired (a redelivery is answered with the group while its key lives).
A started group goes with its execution (a foreign key ON DELETE CASCADE); an open one is
due within its max wait, and starts or fails then.

Batches are small and each is one autocommit statement: the executions it deletes are
locked FOR UPDATE SKIP LOCKED, so several workers share the work without waiting on each
other, and an operator acting on one of them at that moment is skipped, not blocked.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg_pool

from flowforge.domain.definitions import DEFAULT_RETENTION_DAYS
from flowforge.domain.model import ExecutionStatus, GroupStatus, StepStatus
from flowforge.store.archive import EXPIRE_ARCHIVE
from flowforge.store.config import DEFAULT_IDEMPOTENCY_KEY_HOURS
from flowforge.store.db import wrap_exceptions
from flowforge.store.events import EXPIRE_EVENTS

logger = logging.getLogger(__name__)

# Retention of a source's unmatched events (store/sources.py records them): kept
# UNMATCHED_DAYS, and at most the newest UNMATCHED_PER_SOURCE per source — an auth "none"
# source lets anyone add rows, so age alone would not bound the table. One batch per
# statement, oldest first, through source_unmatched_received and source_unmatched_source
# (migration 0028); rows another worker is deleting are skipped.
UNMATCHED_DAYS = 30
UNMATCHED_PER_SOURCE = 10_000
EXPIRE_UNMATCHED = """
WITH doomed AS (
    SELECT id FROM source_unmatched
    WHERE received_at < now() - make_interval(days => %(days)s)
    ORDER BY received_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), beyond AS (
    SELECT u.id FROM sources s
    CROSS JOIN LATERAL (
        SELECT u.id FROM source_unmatched u WHERE u.source_id = s.id
        ORDER BY u.id DESC OFFSET %(keep)s LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) u
    LIMIT %(limit)s
)
DELETE FROM source_unmatched
WHERE id IN (SELECT id FROM doomed UNION ALL SELECT id FROM beyond)
"""
UNMATCHED_RETENTION = {"days": UNMATCHED_DAYS, "keep": UNMATCHED_PER_SOURCE}

RETENTION_BATCH = 500
# Per housekeeping pass; an unfinished backlog goes on in the next pass, at once.
RETENTION_BUDGET_S = 3.0

_FINISHED = ", ".join(
    f"'{status.value}'"
    for status in (ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED)
)
# Each workflow's cutoff: finished before it, an execution has been kept long enough. A
# value that is not a number (no validated definition has one) counts as the default.
_POLICY = """
SELECT w.id AS workflow_id,
       now() - make_interval(secs => 86400 * coalesce(
           CASE WHEN jsonb_typeof(v.definition -> 'retention_days') = 'number'
                THEN (v.definition ->> 'retention_days')::float8 END,
           %(default_days)s)) AS cutoff
FROM workflows w
JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.latest_version
"""


def _expire(keyed: bool) -> str:
    """One batch of one kind of candidate, per workflow through its partial index."""
    if keyed:
        index = "executions_finished_keyed"
        kind = "x.idempotency_key IS NOT NULL"
        # Kept at least as long as its key (FORGET_IDEMPOTENCY_KEYS, the same key_hours):
        # an execution finishes after it was created, with its key, so finished longer
        # ago than that, its key has expired and, unless housekeeping lags, is forgotten.
        cutoff = "least(p.cutoff, now() - %(key_hours)s::float8 * interval '1 hour')"
        remembered = """
          AND NOT EXISTS (SELECT 1 FROM idempotency_keys k
                          WHERE k.workflow_id = x.workflow_id AND k.key = x.idempotency_key
                            AND k.execution_id = x.id)"""
    else:
        index = "executions_finished"
        kind = "x.idempotency_key IS NULL"
        cutoff = "p.cutoff"
        remembered = ""
    return f"""
-- expire ({index}): one batch of finished executions past their retention; locks each
-- deleted execution (SKIP LOCKED) and, through the cascades, its child rows.
WITH policy AS ({_POLICY}), doomed AS (
    SELECT d.id
    FROM policy p
    CROSS JOIN LATERAL (
        SELECT x.id FROM executions x
        WHERE x.workflow_id = p.workflow_id
          AND x.status IN ({_FINISHED}) AND {kind}
          AND x.finished_at < {cutoff}
          AND NOT EXISTS (SELECT 1 FROM steps s
                          WHERE s.execution_id = x.id AND s.status = '{StepStatus.UNKNOWN.value}')
          {remembered}
        ORDER BY x.finished_at
        LIMIT %(limit)s
        FOR UPDATE OF x SKIP LOCKED
    ) d
    LIMIT %(limit)s
)
DELETE FROM executions WHERE id IN (SELECT id FROM doomed)
"""


EXPIRE_UNKEYED = _expire(keyed=False)
EXPIRE_KEYED = _expire(keyed=True)
# One batch of failed groups past their retention, through intake_groups_failed, kept as
# long as a keyed execution (their events' keys were made before the group failed); the
# cascade deletes their events. A group being claimed right now is skipped.
EXPIRE_FAILED_GROUPS = f"""
WITH policy AS ({_POLICY}), doomed AS (
    SELECT d.id
    FROM policy p
    CROSS JOIN LATERAL (
        SELECT g.id FROM intake_groups g
        WHERE g.workflow_id = p.workflow_id AND g.status = '{GroupStatus.FAILED.value}'
          AND g.started_at < least(p.cutoff, now() - %(key_hours)s::float8 * interval '1 hour')
        ORDER BY g.started_at
        LIMIT %(limit)s
        FOR UPDATE OF g SKIP LOCKED
    ) d
    LIMIT %(limit)s
)
DELETE FROM intake_groups WHERE id IN (SELECT id FROM doomed)
"""


class Retention:
    """Deletes finished executions past their workflow's retention, batch by batch."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        stop: threading.Event,
        *,
        batch: int = RETENTION_BATCH,
        budget_s: float = RETENTION_BUDGET_S,
        key_hours: float = DEFAULT_IDEMPOTENCY_KEY_HOURS,
    ) -> None:
        self.pool = pool
        self.key_hours = key_hours
        self.stop = stop
        self.batch = batch
        self.budget_s = budget_s

    def expire(self) -> tuple[int, bool]:
        """Delete expired executions; returns how many and whether none is left.

        Batches follow each other until both kinds come back short, or the budget is
        spent: each is one short transaction, so no lock is held for long and a backlog
        (a retention just shortened) is worked off over several passes.
        """
        started = time.monotonic()
        deleted = 0
        pending = [EXPIRE_UNKEYED, EXPIRE_KEYED]
        params = {
            "limit": self.batch,
            "default_days": DEFAULT_RETENTION_DAYS,
            "key_hours": self.key_hours,
        }
        with wrap_exceptions(), self.pool.connection() as conn:
            while pending and not self.stop.is_set():
                for statement in list(pending):
                    count = conn.execute(statement, params).rowcount
                    deleted += count
                    if count < self.batch:
                        pending.remove(statement)
                if time.monotonic() - started > self.budget_s:
                    break
        if deleted:
            logger.info("deleted executions past their retention", extra={"count": deleted})
        return deleted, not pending

    def expire_groups(self) -> tuple[int, bool]:
        """Delete failed debounce and batch groups, with their events, past their
        workflow's retention (EXPIRE_FAILED_GROUPS); returns how many and whether none is
        left."""
        params = {
            "limit": self.batch,
            "default_days": DEFAULT_RETENTION_DAYS,
            "key_hours": self.key_hours,
        }
        return self._batches(
            EXPIRE_FAILED_GROUPS, params, "deleted failed groups past their retention"
        )

    def expire_archive(self) -> tuple[int, bool]:
        """Delete archived webhooks past their workflow's archive_days (archive.py);
        returns how many and whether none is left."""
        return self._batches(
            EXPIRE_ARCHIVE, {"limit": self.batch}, "deleted archived webhooks past archive_days"
        )

    def expire_unmatched(self) -> tuple[int, bool]:
        """Delete source events no subscription matched past their retention
        (EXPIRE_UNMATCHED: 30 days, the newest 10,000 per source); returns how
        many and whether none is left."""
        params = {**UNMATCHED_RETENTION, "limit": self.batch}
        return self._batches(EXPIRE_UNMATCHED, params, "deleted unmatched source events")

    def expire_events(self) -> tuple[int, bool]:
        """Delete events past FLOWFORGE_EVENT_LOOKBACK_S (docs/contract.md#events), their
        consumptions with them; returns how many and whether none is left."""
        return self._batches(EXPIRE_EVENTS, {"limit": self.batch}, "deleted expired events")

    def _batches(self, statement: str, params: dict[str, Any], done: str) -> tuple[int, bool]:
        """Run a batched DELETE until a batch comes back short or the pass's budget is
        spent (then the next pass goes on); log `done` with the count when anything went."""
        started = time.monotonic()
        deleted = 0
        with wrap_exceptions(), self.pool.connection() as conn:
            while not self.stop.is_set():
                count = conn.execute(statement, params).rowcount
                deleted += count
                if count < self.batch:
                    break
                if time.monotonic() - started > self.budget_s:
                    return deleted, False
        if deleted:
            logger.info(done, extra={"count": deleted})
        return deleted, not self.stop.is_set()
