"""The reaper thread: three jobs in one pass, each on its own.

Lease recovery (`recovery.py`; the heartbeat that renews our own leases lives in
`leases.py`), the reconciler that re-dispatches ready work whose wake-up message went
missing (`reconciler.py`), and housekeeping of old idempotency keys (`housekeeping.py`).
A job that fails is reported under the loop's error policy and starves no other.
"""

from __future__ import annotations

import threading

import psycopg_pool

from flowforge.worker.housekeeping import Housekeeping
from flowforge.worker.loop import Loop, report
from flowforge.worker.reconciler import Reconciler
from flowforge.worker.recovery import LeaseRecovery


class Reaper(Loop):
    """Recovers expired leases, re-dispatches lost wake-ups, forgets old idempotency keys."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        *,
        lease_s: float,
        reconcile_s: float,
        stop: threading.Event,
    ) -> None:
        super().__init__("reaper", stop)
        self.interval = max(0.2, min(lease_s, reconcile_s) / 4)
        self.recovery = LeaseRecovery(pool)
        self.reconciler = Reconciler(pool, reconcile_s=reconcile_s)
        self.housekeeping = Housekeeping(pool, stop)

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

    def housekeep(self) -> int:
        """Forget old idempotency keys when due (see Housekeeping.housekeep)."""
        return self.housekeeping.housekeep()

    def forget_expired_keys(self) -> tuple[int, bool]:
        """Delete expired keys until caught up or out of budget."""
        return self.housekeeping.forget_expired_keys()

    def run_pass(self) -> None:
        """Reap, reconcile, housekeep: each on its own, so one that fails starves no other."""
        for name, job in (
            ("reap", self.reap),
            ("reconcile", self.reconcile),
            ("housekeep", self.housekeep),
        ):
            try:
                job()
            except Exception as exc:
                report(f"reaper.{name}", exc)
