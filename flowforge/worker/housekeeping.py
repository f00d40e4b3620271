"""The housekeeping thread: idempotency keys (and sources' delivery identities) are
forgotten once they are older than FLOWFORGE_IDEMPOTENCY_KEY_HOURS (default 24,
docs/contract.md), then finished executions past
their workflow's retention are deleted (retention.py).

A thread of its own, not a job of the reaper: a backlog of keys or executions keeps a
pass busy for seconds, and lease recovery and the reconciler must never wait behind it.
Every batch checks the stop event, so a drain is not held up either.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg_pool

from flowforge import faults
from flowforge.store.config import DEFAULT_IDEMPOTENCY_KEY_HOURS
from flowforge.store.db import wrap_exceptions
from flowforge.worker.loop import Loop
from flowforge.worker.retention import Retention

logger = logging.getLogger(__name__)

HOUSEKEEPING_SECONDS = 60.0
# Per pass for the keys (and RETENTION_BUDGET_S for executions): a backlog of one kind
# does not starve the other, and each pass logs what it did.
HOUSEKEEPING_BUDGET_S = 5.0
FORGET_BATCH = 10_000
# One batch of keys older than their lifetime (hours, a parameter), oldest first through
# idempotency_keys_by_age; row locks only on the keys it deletes.
FORGET_IDEMPOTENCY_KEYS = """
DELETE FROM idempotency_keys
WHERE ctid = ANY(ARRAY(SELECT ctid FROM idempotency_keys
                       WHERE created_at < now() - %(key_hours)s::float8 * interval '1 hour'
                       ORDER BY created_at LIMIT %(limit)s))
"""
# A source's delivery identities (sources.py) live as long as the keys they stand beside.
FORGET_SOURCE_DELIVERIES = """
DELETE FROM source_deliveries
WHERE ctid = ANY(ARRAY(SELECT ctid FROM source_deliveries
                       WHERE created_at < now() - %(key_hours)s::float8 * interval '1 hour'
                       ORDER BY created_at LIMIT %(limit)s))
"""


class Housekeeping(Loop):
    """Forgets expired idempotency keys and old executions, once a minute, until caught up."""

    interval = HOUSEKEEPING_SECONDS

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        stop: threading.Event,
        *,
        key_hours: float = DEFAULT_IDEMPOTENCY_KEY_HOURS,
    ) -> None:
        super().__init__("housekeeping", stop)
        self.pool = pool
        self.key_hours = key_hours
        self.retention = Retention(pool, stop, key_hours=key_hours)

    def step(self) -> float:
        """One pass; an unfinished backlog goes on at once instead of waiting a minute."""
        _forgotten, caught_up = self.housekeep()
        return self.interval if caught_up else 0.0

    def housekeep(self) -> tuple[int, bool]:
        """Forget expired keys, then expire executions; returns keys forgotten, caught up.

        Executions go after the keys so that one whose key was just forgotten goes in the
        same pass.
        """
        forgotten, keys_caught_up = self.forget_expired_keys()
        _expired, executions_caught_up = self.retention.expire()
        _groups, groups_caught_up = self.retention.expire_groups()
        _archived, archive_caught_up = self.retention.expire_archive()
        _unmatched, unmatched_caught_up = self.retention.expire_unmatched()
        _events, events_caught_up = self.retention.expire_events()
        if forgotten:
            logger.info("forgot old idempotency keys", extra={"count": forgotten})
        caught_up = (
            groups_caught_up and archive_caught_up and unmatched_caught_up and events_caught_up
        )
        return forgotten, keys_caught_up and executions_caught_up and caught_up

    def forget_expired_keys(self) -> tuple[int, bool]:
        """Delete expired keys batch after batch; returns how many and whether caught up.

        One batch per statement keeps each delete's locks short; batches follow each other
        until one comes back short, so cleanup keeps up with any intake rate the database
        can delete at, for at most HOUSEKEEPING_BUDGET_S per call.
        """
        started = time.monotonic()
        forgotten = 0
        params = {"limit": FORGET_BATCH, "key_hours": self.key_hours}
        with wrap_exceptions(), self.pool.connection() as conn:
            faults.hit("housekeeping_keys", self.stop)
            while not self.stop.is_set():
                deleted = conn.execute(FORGET_IDEMPOTENCY_KEYS, params).rowcount
                deliveries = conn.execute(FORGET_SOURCE_DELIVERIES, params).rowcount
                forgotten += deleted
                if max(deleted, deliveries) < FORGET_BATCH:
                    return forgotten, True
                if time.monotonic() - started > HOUSEKEEPING_BUDGET_S:
                    break
        return forgotten, False
