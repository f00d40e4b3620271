"""The nemesis and the operator. At moments drawn from a seeded RNG the nemesis SIGKILLs
(then restarts) and SIGSTOPs/SIGCONTs workers, and resets, blackholes and strands their
PostgreSQL and RabbitMQ links through their proxies; the operator, on a thread of its
own, cancels, retries and resolves live executions through the API.

Faults overlap: each one schedules its own heal, and one thread runs faults and heals in
time order, so the order of decisions follows the seed (what they hit depends on timing).
"""

from __future__ import annotations

import heapq
import itertools
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.soak.cluster import Cluster, WorkerSlot
from tests.soak.history import History, OperatorAction, RecordingClient

# Relative weights of the operations. Each operation takes three draws in [0, 1): which
# target (pick), how long (duration), and a coin for one more choice. They are drawn
# whether or not the operation finds something to hit, so one skipped operation does not
# shift every later decision of a replay.
FAULTS = {
    "kill": 2.0,
    "pause": 3.0,
    "pg_reset": 2.0,
    "pg_blackhole": 2.0,
    "amqp_reset": 1.0,
    "amqp_blackhole": 1.0,
    "amqp_strand": 0.7,
}
ACTIONS = {"cancel": 3.0, "retry": 3.0, "resolve": 2.0}


def _loop(
    stop: threading.Event,
    rng: random.Random,
    interval: tuple[float, float],
    operations: dict[str, float],
    perform: Callable[[str, float, float, float], None],
    between: Callable[[], None],
) -> None:
    """Draw an operation at random moments until `stop`; `between` runs while waiting."""
    names, weights = list(operations), list(operations.values())
    while not stop.is_set():
        next_at = time.monotonic() + rng.uniform(*interval)
        while not stop.is_set() and time.monotonic() < next_at:
            between()
            stop.wait(0.05)
        if stop.is_set():
            return
        op = rng.choices(names, weights)[0]
        perform(op, rng.random(), rng.random(), rng.random())


class Nemesis:
    """Process and network faults until stopped; then heals every fault it started.

    One thread runs faults and heals in time order, and nothing in it waits on the API:
    a heal (SIGCONT, restore) is never late because some request hangs."""

    def __init__(
        self,
        cluster: Cluster,
        history: History,
        rng: random.Random,
        *,
        interval: tuple[float, float],
        lease_s: float,
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.rng = rng
        self.interval = interval
        self.lease_s = lease_s
        self.heals: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        # Proxy faults in force, so two faults on one link do not heal each other early.
        self._faulted: set[str] = set()

    # ---- scheduling ----------------------------------------------------------------

    def later(self, delay_s: float, heal: Callable[[], None]) -> None:
        heapq.heappush(self.heals, (time.monotonic() + delay_s, next(self._order), heal))

    def run_due_heals(self, until: float | None = None) -> None:
        while self.heals and (until is None or self.heals[0][0] <= until):
            _, _, heal = heapq.heappop(self.heals)
            heal()

    def run(self, stop: threading.Event) -> None:
        """Fault, wait, fault again; heals fire on time in between and all at the end."""
        try:
            _loop(
                stop,
                self.rng,
                self.interval,
                FAULTS,
                lambda op, *draws: getattr(self, op)(*draws),
                lambda: self.run_due_heals(time.monotonic()),
            )
        finally:
            self.run_due_heals()

    def _slot(self, pick: float, usable: Callable[[WorkerSlot], bool]) -> WorkerSlot | None:
        slots = [slot for slot in self.cluster.slots if usable(slot)]
        return slots[int(pick * len(slots))] if slots else None

    # ---- process faults ------------------------------------------------------------

    def kill(self, pick: float, duration: float, coin: float) -> None:
        """SIGKILL a worker; its successor starts 0.5-4 s later, and one in three is a slow
        sender: it stalls 0.5-1.8 s between its claim commit and the request (less than a
        lease, so alone it loses nothing). A pause or a cut database link that lands in
        such a stall is what a fence before the send is for."""
        slot = self._slot(pick, lambda s: s.alive)
        if slot is None:
            return
        self.history.fault("kill", slot.worker_id)
        assert slot.proc is not None
        slot.proc.kill()
        stall = f"after_claim_commit=sleep:{0.5 + 1.3 * coin / 0.35:.1f}" if coin < 0.35 else ""

        def restart() -> None:
            self.cluster.spawn(slot, faults=stall)
            self.history.fault("restart", slot.worker_id, stall)

        self.later(0.5 + 3.5 * duration, restart)

    def pause(self, pick: float, duration: float, coin: float) -> None:
        """SIGSTOP a worker for 0.5-4 leases, then SIGCONT."""
        slot = self._slot(pick, lambda s: s.alive and not s.paused)
        if slot is None:
            return
        seconds = self.lease_s * (0.5 + 3.5 * duration)
        self.history.fault("pause", slot.worker_id, f"{seconds:.1f}s")
        slot.signal_group(signal.SIGSTOP)
        slot.paused = True
        generation = slot.generation

        def resume() -> None:
            if slot.generation == generation:
                slot.signal_group(signal.SIGCONT)
                slot.paused = False
                self.history.fault("resume", slot.worker_id)

        self.later(seconds, resume)

    # ---- network faults ------------------------------------------------------------

    def _link_fault(self, link: str, mode: str, pick: float, duration: float, coin: float) -> None:
        slot = self._slot(pick, lambda s: f"{s.index}:{link}" not in self._faulted)
        if slot is None:
            return
        proxy = slot.pg if link == "pg" else slot.amqp
        name = f"{slot.index}:{link}"
        self._faulted.add(name)
        if mode == "reset":
            seconds = 0.1 + 1.9 * duration
            proxy.cut()
        else:
            seconds = 1.0 + 7.0 * duration
            proxy.blackhole()
        self.history.fault(f"{link}_{mode}", slot.worker_id, f"{seconds:.1f}s")
        # Half the blackholes end with a reset, like a partition whose connection state
        # was lost on the way; the others deliver what they held back.
        reset_at_end = mode == "blackhole" and coin < 0.5

        def heal() -> None:
            if reset_at_end:
                proxy.cut()
            proxy.restore()
            self._faulted.discard(name)
            self.history.fault(f"{link}_heal", slot.worker_id, "reset" if reset_at_end else "")

        self.later(seconds, heal)

    def pg_reset(self, pick: float, duration: float, coin: float) -> None:
        self._link_fault("pg", "reset", pick, duration, coin)

    def pg_blackhole(self, pick: float, duration: float, coin: float) -> None:
        self._link_fault("pg", "blackhole", pick, duration, coin)

    def amqp_strand(self, pick: float, duration: float, coin: float) -> None:
        """Silence a worker's broker connections for good: no heal, only the worker's own
        AMQP heartbeat (or its death) gets it out.

        There is no PostgreSQL twin: through a TCP proxy a silent link still has its
        packets acknowledged (by the proxy's kernel), so TCP keepalive and
        tcp_user_timeout — what a real partition is detected by — cannot see it, and a
        correct worker would hang here while it would not on a real network."""
        slot = self._slot(pick, lambda s: s.alive)
        if slot is None:
            return
        slot.amqp.strand()
        self.history.fault("amqp_strand", slot.worker_id)

    def amqp_reset(self, pick: float, duration: float, coin: float) -> None:
        self._link_fault("amqp", "reset", pick, duration, coin)

    def amqp_blackhole(self, pick: float, duration: float, coin: float) -> None:
        self._link_fault("amqp", "blackhole", pick, duration, coin)


class Operator:
    """A human at the API: cancels, retries and resolves live executions at random moments.
    Its own thread, so a request that waits on a frozen worker's row lock holds up only it.
    """

    def __init__(
        self,
        cluster: Cluster,
        client: RecordingClient,
        history: History,
        rng: random.Random,
        *,
        interval: tuple[float, float],
    ) -> None:
        self.cluster = cluster
        self.client = client
        self.history = history
        self.rng = rng
        self.interval = interval
        # What this operator cancelled, newest last: people change their minds, and a
        # retry soon after a cancel is where re-sent requests hide.
        self.cancelled: list[str] = []

    def run(self, stop: threading.Event) -> None:
        _loop(
            stop,
            self.rng,
            self.interval,
            ACTIONS,
            lambda op, *draws: getattr(self, op)(*draws),
            lambda: None,
        )

    def _api(self, coin: float) -> str:
        bases = self.cluster.api_bases
        return bases[int(coin * len(bases))]

    def _executions(self, base: str, statuses: list[str]) -> list[str]:
        found: list[str] = []
        for status in statuses:
            r = self.client.request(
                "operator", "GET", f"{base}/api/v1/executions?status={status}&limit=100"
            )
            if r is not None and r.status_code == 200:
                found.extend(item["id"] for item in r.json()["items"])
        return sorted(found)

    def _steps(self, base: str, execution_id: str) -> dict[str, str] | None:
        r = self.client.request("operator", "GET", f"{base}/api/v1/executions/{execution_id}")
        if r is None or r.status_code != 200:
            return None
        return {s["id"]: s["status"] for s in r.json()["steps"]}

    def _act(
        self, action: str, base: str, execution_id: str, path: str, body: Any = None, **extra: Any
    ) -> int | None:
        """Look at the execution, act on it, record both; the API's status code."""
        at, wall = self.history.now(), time.time()
        before = self._steps(base, execution_id) or {}
        r = self.client.request("operator", "POST", f"{base}{path}", json=body)
        self.history.action(
            OperatorAction(
                at,
                wall,
                action,
                execution_id,
                r.status_code if r is not None else None,
                steps_before=before,
                **extra,
            )
        )
        return r.status_code if r is not None else None

    def cancel(self, pick: float, duration: float, coin: float) -> None:
        """Cancel a running execution (mostly), or a waiting, queued or needs_attention one."""
        base = self._api(coin)
        statuses = ["running"] if duration < 0.7 else ["waiting", "queued", "needs_attention"]
        live = self._executions(base, statuses)
        if not live:
            return
        eid = live[int(pick * len(live))]
        if self._act("cancel", base, eid, f"/api/v1/executions/{eid}/cancel") in (200, 202):
            self.cancelled.append(eid)

    def retry(self, pick: float, duration: float, coin: float) -> None:
        """Retry one of the last executions this operator cancelled (half the time), or
        any cancelled, failed or needs_attention execution."""
        base = self._api(coin)
        if duration < 0.5 and self.cancelled:
            recent = self.cancelled[-5:]
            eid = recent[int(pick * len(recent))]
        else:
            done = self._executions(base, ["cancelled", "needs_attention", "failed"])
            if not done:
                return
            eid = done[int(pick * len(done))]
        self._act("retry", base, eid, f"/api/v1/executions/{eid}/retry")

    def resolve(self, pick: float, duration: float, coin: float) -> None:
        """Settle an unknown step as succeeded (with an output) or failed."""
        base = self._api(coin)
        waiting = self._executions(base, ["needs_attention"])
        if not waiting:
            return
        eid = waiting[int(pick * len(waiting))]
        steps = self._steps(base, eid) or {}
        unknown = sorted(sid for sid, status in steps.items() if status == "unknown")
        if not unknown:
            return
        sid = unknown[int(duration * len(unknown))]
        outcome = "succeeded" if duration < 0.6 else "failed"
        body: dict[str, Any] = {"outcome": outcome}
        if outcome == "succeeded":
            body["output"] = {"status": 200, "headers": {}, "body": {"id": "resolved", "go": True}}
        self._act(
            "resolve",
            base,
            eid,
            f"/api/v1/executions/{eid}/steps/{sid}/resolve",
            body,
            step_id=sid,
            outcome=outcome,
        )
