"""The reaper thread: two jobs in one pass, each on its own.

Lease recovery (`recovery.py`; the heartbeat that renews our own leases lives in
`leases.py`) and the reconciler that re-dispatches ready work whose wake-up message went
missing (`reconciler.py`). A job that fails is reported under the loop's error policy and
starves no other. Housekeeping (old idempotency keys, retention) has its own thread,
`housekeeping.py`, so that recovery never waits behind a backlog.
"""

from __future__ import annotations

import threading

import psycopg_pool

from flowforge.store.db import wrap_exceptions
from flowforge.usecases import actions
from flowforge.worker.broker import QueueHead
from flowforge.worker.loop import Loop, report
from flowforge.worker.reconciler import Reconciler
from flowforge.worker.recovery import LeaseRecovery


class Reaper(Loop):
    """Recovers expired leases and re-dispatches lost wake-ups."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        *,
        lease_s: float,
        reconcile_s: float,
        stop: threading.Event,
        head: QueueHead | None = None,
    ) -> None:
        super().__init__("reaper", stop)
        self.interval = max(0.2, min(lease_s, reconcile_s) / 4)
        self.pool = pool
        self.recovery = LeaseRecovery(pool)
        self.reconciler = Reconciler(pool, reconcile_s=reconcile_s, head=head)

    def first_wait(self) -> float:
        return self.interval

    def step(self) -> float:
        self.run_pass()
        return self.interval

    def reap(self) -> int:
        """Recover every expired lease (see LeaseRecovery.reap)."""
        return self.recovery.reap()

    def reconcile(self) -> int:
        """Re-dispatch ready steps whose message went missing."""
        return self.reconciler.reconcile()

    def cancel(self) -> int:
        """Apply operator cancels recorded while their execution was locked."""
        with wrap_exceptions(), self.pool.connection() as conn:
            return actions.apply_pending_cancels(conn)

    def run_pass(self) -> None:
        """Reap, reconcile, apply pending cancels: each on its own, so one that fails
        starves no other."""
        jobs = (("reap", self.reap), ("reconcile", self.reconcile), ("cancel", self.cancel))
        for name, job in jobs:
            try:
                job()
            except Exception as exc:
                report(f"reaper.{name}", exc)
