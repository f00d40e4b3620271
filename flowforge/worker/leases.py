"""The leases this worker holds, and the heartbeat that renews them (docs/contract.md#leases).

A lease enters the set only after the claim transaction that created it committed, and
only for as long as the code working on the step stays inside `Leases.holding()` — so
the heartbeat never renews a lease that nobody works on, whatever went wrong around the
claim. Each holder has a lease object of its own (two claims of one step by two threads,
a stale one and a current one, never share or drop each other's entry).

Every lease also knows, on this worker's monotonic clock, when its expiry was last set:
the moment just before the claim or the renewal that set it was sent. PostgreSQL's
now() in that statement is no earlier, so the database's expiry is at least a lease
later. A request may leave only before half of that lease has passed (`still_ours`): the
other half is the margin for clock-rate differences and a late heartbeat, and a worker
frozen past it — reaped, perhaps retried or resolved by an operator meanwhile — does not
send when it wakes up.

Liveness (worker_heartbeats, migration 0021): the heartbeat also upserts this worker's
row at least every WORKER_BEAT_S, and any reaper expires at once the leases of a worker
whose row is older than WORKER_DEAD_AFTER_S — a killed host's steps are recovered in
seconds, not after their whole lease. The same fencing applies: a request may leave only
before half of WORKER_DEAD_AFTER_S has passed since the last beat this worker knows
committed (or since its first beat was sent, until one is known to have committed).

Orphans (docs/howto/several-hosts.md, "After an asynchronous failover"): a step the
database says this worker runs, though no thread here holds it — its checkpoint committed
on a primary that was lost before the standby got it. Nobody would renew that lease, but
the worker stays alive, so it would wait out the whole lease. The heartbeat expires such
a lease at once when it sees it unheld at two beats in a row (a claim that committed a
moment ago is not held yet, but never for a whole beat), and the reaper recovers the step.
A holder that enters after all with a lease so released finds it lost and sends nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg_pool

from flowforge.domain.model import WORKER_BEAT_S, WORKER_DEAD_AFTER_S
from flowforge.observe import metrics
from flowforge.store.db import wrap_exceptions
from flowforge.worker.loop import Loop

logger = logging.getLogger(__name__)

# Share of a lease after its last confirmation during which a request may still be sent.
SAFE_FRACTION = 0.5
# Renewals per lease period; a beat can be late by a third of a lease before any
# request is refused for want of a confirmation.
BEATS_PER_LEASE = 6

# Renews only leases that still carry our token and our name and have not run out; whatever
# is missing from the answer was taken from us. An expired lease belongs to lease recovery
# (which may already have read it as expired): a late beat must not revive it.
RENEW = """
UPDATE steps s SET lease_expires_at = now() + make_interval(secs => %(lease_s)s)
FROM unnest(%(execution_ids)s::uuid[], %(step_ids)s::text[], %(tokens)s::bigint[])
     AS held(execution_id, step_id, token)
WHERE s.execution_id = held.execution_id AND s.step_id = held.step_id
  AND s.fencing_token = held.token AND s.status = 'running' AND s.lease_owner = %(owner)s
  AND s.lease_expires_at > now()
RETURNING s.execution_id, s.step_id, s.fencing_token
"""


# Our running steps, to find the ones no thread holds (orphans, above).
OURS = """
SELECT execution_id::text, step_id, fencing_token FROM steps
WHERE status = 'running' AND lease_owner = %(owner)s AND lease_expires_at > now()
"""
# Hands orphans to lease recovery now rather than after their lease.
RELEASE = """
UPDATE steps s SET lease_expires_at = now()
FROM unnest(%(execution_ids)s::uuid[], %(step_ids)s::text[], %(tokens)s::bigint[])
     AS o(execution_id, step_id, token)
WHERE s.execution_id = o.execution_id AND s.step_id = o.step_id
  AND s.fencing_token = o.token AND s.status = 'running' AND s.lease_owner = %(owner)s
RETURNING s.execution_id, s.step_id, s.fencing_token
"""

BEAT = """
INSERT INTO worker_heartbeats (worker_id) VALUES (%(owner)s)
ON CONFLICT (worker_id) DO UPDATE SET beat_at = now()
"""
GONE = "DELETE FROM worker_heartbeats WHERE worker_id = %(owner)s"


class Liveness:
    """When this worker last knew its liveness row fresh, on its monotonic clock."""

    def __init__(self) -> None:
        self.since: float | None = None  # None: no beat sent yet, so no row to go stale

    def deadline(self) -> float:
        """Monotonic time after which no request may leave (see the module docstring)."""
        if self.since is None:
            return float("inf")
        return self.since + SAFE_FRACTION * WORKER_DEAD_AFTER_S


class Lease:
    """One committed claim of one step, held by the thread working on it."""

    def __init__(
        self,
        execution_id: str,
        step_id: str,
        token: int,
        lease_s: float,
        confirmed_at: float,
        liveness: Liveness | None = None,
    ) -> None:
        self.liveness = liveness or Liveness()
        self.execution_id = execution_id
        self.step_id = step_id
        self.token = token
        self.lease_s = lease_s
        self.confirmed_at = confirmed_at
        self.lost = False
        # Set by the holder before its checkpoint commits: from then on the step may stop
        # running at any moment, and a renewal that finds it gone is no takeover.
        self.finished = False

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.execution_id, self.step_id, self.token)

    def still_ours(self) -> bool:
        """Whether this worker knows the lease is its own right now (safe to send)."""
        now = time.monotonic()
        return not self.lost and now < self.deadline and now < self.liveness.deadline()

    @property
    def deadline(self) -> float:
        """Monotonic time after which a request must not leave under this lease."""
        return self.confirmed_at + SAFE_FRACTION * self.lease_s


class Leases:
    """The set of leases held by this process's executor threads."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self.liveness = Liveness()
        self._lock = threading.Lock()
        self._held: set[Lease] = set()
        self._released: set[tuple[str, str, int]] = set()

    @contextmanager
    def holding(
        self, execution_id: str, step_id: str, token: int, confirmed_at: float
    ) -> Iterator[Lease]:
        """Hold the lease of a committed claim for the body of the block, and not longer.

        `confirmed_at` is the monotonic time taken before the claim transaction began.
        """
        lease = Lease(execution_id, step_id, token, self.lease_s, confirmed_at, self.liveness)
        with self._lock:
            lease.lost = lease.key in self._released
            self._held.add(lease)
        try:
            yield lease
        finally:
            with self._lock:
                self._held.discard(lease)  # this holder's entry only, never another's

    def snapshot(self) -> list[Lease]:
        """The leases held right now."""
        with self._lock:
            return list(self._held)

    def is_held(self, lease: Lease) -> bool:
        with self._lock:
            return lease in self._held

    def release_unheld(
        self, ours: set[tuple[str, str, int]], before: set[tuple[str, str, int]]
    ) -> tuple[set[tuple[str, str, int]], set[tuple[str, str, int]]]:
        """Of the steps the database says we run (`ours`), the ones no thread holds now,
        and of those the ones also unheld at the previous beat (`before`): the orphans,
        released here and now, so a holder that still enters with one finds it lost."""
        with self._lock:
            unheld = ours - {lease.key for lease in self._held}
            orphans = unheld & before
            self._released |= orphans
        return unheld, orphans


class Heartbeat(Loop):
    """Renews the leases held by this process, several times per lease period, and keeps
    its liveness row fresh."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        leases: Leases,
        worker_id: str,
        stop: threading.Event,
    ) -> None:
        super().__init__("heartbeat", stop)
        self.pool = pool
        self.leases = leases
        self.worker_id = worker_id
        self.interval = min(leases.lease_s / BEATS_PER_LEASE, WORKER_BEAT_S)
        self.beaten = metrics.WORKER_HEARTBEAT.labels(worker=worker_id)
        self.unheld: set[tuple[str, str, int]] = set()

    def first_wait(self) -> float:
        return 0.0

    def step(self) -> float:
        self.live()
        self.beat()
        self.release_orphans()
        self.beaten.set_to_current_time()  # after the renewal: a beat that fails is none
        return self.interval

    def live(self) -> None:
        """Upsert this worker's liveness row."""
        sent_at = time.monotonic()
        liveness = self.leases.liveness
        if liveness.since is None:
            liveness.since = sent_at  # from now on a row may exist, and may go stale
        with wrap_exceptions(), self.pool.connection() as conn:
            conn.execute(BEAT, {"owner": self.worker_id})
        liveness.since = max(liveness.since, sent_at)

    def close(self) -> None:
        """A clean stop: this worker's row goes (its steps were drained before)."""
        if not self.stop.is_set():
            return
        try:
            with wrap_exceptions(), self.pool.connection(timeout=2) as conn:
                conn.execute(GONE, {"owner": self.worker_id})
        except Exception as exc:  # the row then goes stale and is reaped; no harm
            logger.warning("liveness row not removed: %s", exc)

    def release_orphans(self) -> None:
        """Expire the leases of our steps no thread has held for a whole beat (module
        docstring: orphans); lease recovery takes them on its next pass."""
        with wrap_exceptions(), self.pool.connection() as conn:
            ours = {
                (eid, sid, token)
                for eid, sid, token in conn.execute(OURS, {"owner": self.worker_id})
            }
            self.unheld, orphans = self.leases.release_unheld(ours, self.unheld)
            if not orphans:
                return
            released = conn.execute(
                RELEASE,
                {
                    "owner": self.worker_id,
                    "execution_ids": [o[0] for o in orphans],
                    "step_ids": [o[1] for o in orphans],
                    "tokens": [o[2] for o in orphans],
                },
            ).fetchall()
        for eid, sid, token in released:
            logger.warning(
                "lease released: this worker runs no such step (its outcome was lost, as in "
                "a failover)",
                extra={"execution_id": str(eid), "step": sid, "fencing_token": token},
            )

    def beat(self) -> None:
        """Renew every lease still worked on; mark and log the ones another worker took over."""
        held = [lease for lease in self.leases.snapshot() if not (lease.lost or lease.finished)]
        if not held:
            return
        sent_at = time.monotonic()
        with wrap_exceptions(), self.pool.connection() as conn:
            renewed = {
                (str(eid), sid, token)
                for eid, sid, token in conn.execute(
                    RENEW,
                    {
                        "lease_s": self.leases.lease_s,
                        "owner": self.worker_id,
                        "execution_ids": [lease.execution_id for lease in held],
                        "step_ids": [lease.step_id for lease in held],
                        "tokens": [lease.token for lease in held],
                    },
                )
            }
        for lease in held:
            if lease.key in renewed:
                lease.confirmed_at = max(lease.confirmed_at, sent_at)
            elif not lease.finished and self.leases.is_held(lease):
                # Still worked on but not renewed: taken over (a step whose checkpoint
                # committed while we renewed is finished, not lost).
                lease.lost = True
                metrics.LEASES_LOST.inc()
                logger.warning(
                    "lease lost: another worker owns the step now",
                    extra={
                        "execution_id": lease.execution_id,
                        "step": lease.step_id,
                        "fencing_token": lease.token,
                    },
                )
