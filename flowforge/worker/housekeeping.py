"""Housekeeping: idempotency keys are forgotten after their 24 hours (SPEC §4), then
finished executions past their workflow's retention are deleted (retention.py, SPEC §11)."""

from __future__ import annotations

import logging
import threading
import time

import psycopg_pool

from flowforge.db import wrap_exceptions
from flowforge.worker.retention import Retention

logger = logging.getLogger(__name__)

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


class Housekeeping:
    """Forgets expired idempotency keys and old executions, once a minute, until caught up."""

    def __init__(self, pool: psycopg_pool.ConnectionPool, stop: threading.Event) -> None:
        self.pool = pool
        self.stop = stop
        self._housekept_at = 0.0
        self.retention = Retention(pool, stop)

    def housekeep(self) -> int:
        """Forget keys older than 24 hours, then expire executions; once a minute, until caught up.

        An unfinished backlog (see forget_expired_keys) goes on in the next pass instead
        of waiting a minute; so does one of executions past their retention, deleted after
        the keys so that an execution whose key was just forgotten goes in the same pass.
        Returns how many keys were forgotten.
        """
        if time.monotonic() - self._housekept_at < HOUSEKEEPING_SECONDS:
            return 0
        forgotten, keys_caught_up = self.forget_expired_keys()
        _expired, executions_caught_up = self.retention.expire()
        if keys_caught_up and executions_caught_up:
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
