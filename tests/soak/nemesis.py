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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from tests.soak.cluster import Cluster, WorkerSlot
from tests.soak.features import OVERLAPS, PARENT
from tests.soak.history import History, OperatorAction, RecordingClient
from tests.soak.pressure import skewed_env
from tests.soak.servers import Servers
from tests.support.locks import confirmed

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
    "freeze": 0.6,
    "pg_lock_partition": 1.0,
    # tests/soak/pressure.py
    "skew": 0.5,
    "backlog": 0.15,
}
# Faults that act on a worker's links: none without proxies (servers mode ha).
LINK_FAULTS = {"pg_reset", "pg_blackhole", "amqp_reset", "amqp_blackhole", "amqp_strand"}
LINK_FAULTS |= {"pg_lock_partition"}
ACTIONS = {
    "cancel": 3.0,
    "retry": 3.0,
    "resolve": 2.0,
    "complete": 1.5,
    "pause_workflow": 0.7,
    "pause_execution": 1.0,
    "replay": 1.2,
    "bulk_replay": 0.4,
    "reingest": 0.5,
    "close_circuit": 0.3,
    "retry_parent": 1.0,
}
# Workflows the operator pauses (and resumes 2-8 s later).
PAUSABLE = ("orders", "fanout", "metered", "lim_queue", "sched_allow", "mapped", "debounced")
# (workflow, step) a replay starts from: everything upstream must not be sent again.
REPLAY_FROM = {"orders": ("shape", "notify"), "fanout": ("report", "join"), "archived": ("after",)}
# A worker frozen inside a unit of work stays frozen this long (then it is killed and
# replaced): past FLOWFORGE_DB_TIMEOUT_SECONDS, so its session is ended by the server.
FREEZE_S = (12.0, 30.0)
# A worker frozen at arbitrary moments (issue 39 item 1): wherever its threads are —
# writes sent and not committed, a read sent and not fetched — FLICKERS times briefly,
# then once for longer than the database timeout (the product's default, which the run
# keeps), then let go with SIGCONT: a SIGKILL would free its locks and hide the ones no
# timeout covers. One such freeze
# starts FREEZE_ANYWHERE_AT_S into every run (the short form has one whatever its draws);
# the `freeze` operation chooses between it and the freeze inside a checkpoint.
DB_TIMEOUT_S = 15.0
FREEZE_ANYWHERE_S = (24.0, 30.0)
FREEZE_ANYWHERE_AT_S = 6.0
# Every run (the short form too) has a skewed clock, a full disk and a connection storm
# once whatever its draws, at these seconds: the backlog, which lasts longer than the
# reconcile interval by design, comes only from the draws (the long form).
PRESSURE_AT_S = {"skew": 9.0, "pg_disk": 13.0, "pg_storm": 20.0}
FLICKERS = 20
FLICKER_S = 0.25
# The fault points of a unit of work's uncovered moments before issue 39, where
# freeze_at_point stops a worker (flowforge/store/runs.py), and how long its new
# generation may take to reach one.
WRITES_SENT, READS_SENT = "after_writes_sent", "after_reads_sent"
AT_POINT_WITHIN_S = 15.0
# docs/contract.md#frozen-bound: a frozen worker delays its own execution's cancel (and its
# slot) by at most the database timeout or the lease, plus a reaper pass; slack for a loaded
# machine. Judged only while the worker stays frozen.
OWN_BOUND_S = DB_TIMEOUT_S + 8.0
# Sessions (by client port, through the worker's own proxy) that hold a lock in a state
# no server timeout covers: `active` waiting for the client, or `idle` outside a
# transaction; and, after the timeout, any lock at all. (pid, state, state_change) first,
# for tests.support.locks.confirmed.
UNCOVERED_LOCKS = """
SELECT a.pid, a.state, a.state_change, a.wait_event, left(a.query, 50)
FROM pg_stat_activity a
WHERE a.client_port = ANY(%(ports)s)
  AND (%(any_state)s OR (a.state = 'active' AND a.wait_event = 'ClientRead')
       OR a.state = 'idle')
  AND EXISTS (SELECT 1 FROM pg_locks l
              WHERE l.pid = a.pid AND l.granted AND l.locktype <> 'virtualxid')
"""
# The frozen worker's own live executions: a step of theirs is leased to it, or one of
# its sessions holds the execution's row locked (the row's xmax is that session's xid).
OWNED = """
SELECT s.execution_id::text FROM steps s JOIN executions e ON e.id = s.execution_id
WHERE s.lease_owner = %(worker)s AND s.status = 'running'
  AND e.status NOT IN ('succeeded', 'failed', 'cancelled', 'needs_attention')
UNION
SELECT e.id::text FROM executions e JOIN pg_stat_activity a
  ON a.client_port = ANY(%(ports)s) AND e.xmax::text = a.backend_xid::text
WHERE e.status NOT IN ('succeeded', 'failed', 'cancelled', 'needs_attention')
"""
ENDED = """
SELECT count(*) FROM executions
WHERE id = ANY(%(ids)s::uuid[])
  AND (status IN ('succeeded', 'failed', 'cancelled', 'needs_attention')
       OR NOT EXISTS (SELECT 1 FROM steps s WHERE s.execution_id = executions.id
                      AND s.status = 'running'))
"""
# The statements after which a partition drops every answer: the locks of flow control
# (fill_slots' advisory lock) and of the checkpoints and the reaper (row locks).
LOCK_MARKERS = (b"pg_advisory_xact_lock", b"FOR UPDATE")


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
        servers: Servers | None = None,
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.rng = rng
        self.interval = interval
        self.lease_s = lease_s
        self.servers = servers
        self.operations = {
            op: weight for op, weight in FAULTS.items() if cluster.proxied or op not in LINK_FAULTS
        }
        if servers is not None:
            self.operations.update(servers.operations())
        self.frozen: WorkerSlot | None = None
        self.stopping = False
        # Cancels an execution as the operator would (Operator.cancel_now), set by the run.
        self.cancel: Callable[[str], None] | None = None
        # Sends a burst of slow webhooks (Features.burst), set by the run; one at a time.
        self.burst: Callable[[], str] | None = None
        self._bursting = threading.Lock()
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
        self.later(FREEZE_ANYWHERE_AT_S, lambda: self.freeze_at_point(0.5, 0.5, WRITES_SENT))
        self.later(PRESSURE_AT_S["skew"], lambda: self.skew(0.5, 0.5, 0.5))
        for op in ("pg_disk", "pg_storm"):
            if self.servers is not None and op in self.servers.operations():
                self.later(PRESSURE_AT_S[op], lambda op=op: self._server_pressure(op))
        try:
            _loop(
                stop,
                self.rng,
                self.interval,
                self.operations,
                self.perform,
                lambda: self.run_due_heals(time.monotonic()),
            )
        finally:
            self.stopping = True
            self.run_due_heals()
            if self.servers is not None:
                self.servers.heal()

    def perform(self, op: str, pick: float, duration: float, coin: float) -> None:
        if self.servers is not None and op in self.servers.operations():
            self.servers.perform(op, self.history, duration, coin)
        else:
            getattr(self, op)(pick, duration, coin)

    def _server_pressure(self, op: str) -> None:
        """A forced server fault of PRESSURE_AT_S: while another server outage runs (one
        at a time), a second later."""
        assert self.servers is not None
        if self.stopping:
            return  # the run's heals, not a fault at the quiet period
        if self.servers.busy:
            self.later(1.0, lambda: self._server_pressure(op))
        else:
            self.perform(op, 0.5, 0.3, 0.5)

    def _others_can_work(self, frozen: WorkerSlot) -> bool:
        """Whether a worker other than `frozen` runs (alive, not stopped) and no server
        outage is in progress: what a frozen worker's bound is counted in."""
        busy = self.servers is not None and self.servers.busy
        return not busy and any(
            s.alive and not s.paused and s is not frozen for s in self.cluster.slots
        )

    def _slot(self, pick: float, usable: Callable[[WorkerSlot], bool]) -> WorkerSlot | None:
        slots = [slot for slot in self.cluster.slots if usable(slot)]
        return slots[int(pick * len(slots))] if slots else None

    # ---- process faults ------------------------------------------------------------

    def kill(self, pick: float, duration: float, coin: float) -> None:
        """SIGKILL a worker; its successor starts 0.5-4 s later, and one in three is a slow
        sender: it stalls 0.5-1.8 s between its claim commit and the request (less than a
        lease, so alone it loses nothing). A pause or a cut database link that lands in
        such a stall is what a fence before the send is for."""
        slot = self._slot(pick, lambda s: s.alive and s is not self.frozen)
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

    def skew(self, pick: float, duration: float, coin: float) -> None:
        """SIGKILL a worker; its successor's clock is an hour ahead (coin < 0.5) or behind
        (tests/soak/pressure.py), for the rest of its generation."""
        slot = self._slot(pick, lambda s: s.alive and s is not self.frozen)
        env = skewed_env(ahead=coin < 0.5)
        if slot is None or env is None:
            if env is None:
                self.history.fault("skew_skipped", "none", "no libfaketime")
            return
        self.history.fault("kill", slot.worker_id, "to skew its successor's clock")
        assert slot.proc is not None
        slot.proc.kill()
        self.cluster.spawn(slot, extra_env=env)
        self.history.fault("skew", slot.worker_id, env["FAKETIME"])

    def backlog(self, pick: float, duration: float, coin: float) -> None:
        """A burst of slow webhooks that queues work for longer than the reconcile
        interval (tests/soak/pressure.py), sent from a thread of its own."""
        if self.burst is None or not self._bursting.acquire(blocking=False):
            return
        burst = self.burst

        def send() -> None:
            try:
                self.history.fault("backlog", "all", burst())
            finally:
                self._bursting.release()

        threading.Thread(target=send, name="soak-backlog", daemon=True).start()

    def pause(self, pick: float, duration: float, coin: float) -> None:
        """SIGSTOP a worker for 0.5-4 leases, then SIGCONT."""
        slot = self._slot(pick, lambda s: s.alive and not s.paused and s is not self.frozen)
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

    def freeze(self, pick: float, duration: float, coin: float) -> None:
        """Freeze a worker inside a unit of work and leave it frozen while the rest must
        go on (issue 23 item 1): the slot's next generation starts with its checkpoints
        stalled (fault point inside_checkpoint, the execution row locked), is SIGSTOPped
        as soon as one is reached, stays frozen FREEZE_S, then is killed and replaced.
        One freeze at a time; a generation that never reaches a checkpoint within 15 s
        is replaced without a freeze."""
        if coin < 0.25:
            self.freeze_anywhere(pick, duration)
            return
        if coin < 0.5:
            self.freeze_at_point(pick, duration, WRITES_SENT if coin < 0.4 else READS_SENT)
            return
        if self.frozen is not None:
            return
        slot = self._slot(pick, lambda s: s.alive and not s.paused)
        if slot is None:
            return
        self.frozen = slot
        self.history.fault("kill", slot.worker_id, "to freeze its successor")
        assert slot.proc is not None
        slot.proc.kill()
        self.cluster.spawn(slot, faults="inside_checkpoint=sleep:600")
        self.history.fault("restart", slot.worker_id, "inside_checkpoint=sleep:600")
        seconds = FREEZE_S[0] + (FREEZE_S[1] - FREEZE_S[0]) * duration
        generation, gave_up_at = slot.generation, time.monotonic() + 15.0

        def thaw() -> None:
            if slot.generation == generation and slot.alive:
                self.history.fault("thaw", slot.worker_id, "killed")
                assert slot.proc is not None
                slot.proc.kill()
                self.cluster.spawn(slot)
                self.history.fault("restart", slot.worker_id)
            self.frozen = None

        def watch() -> None:
            if slot.generation != generation or not slot.alive:
                self.frozen = None
                return
            assert slot.proc is not None
            if "fault point reached" in slot.proc.log():
                slot.signal_group(signal.SIGSTOP)
                slot.paused = True
                self.history.fault("freeze", slot.worker_id, f"{seconds:.1f}s")
                self.later(seconds, thaw)
            elif time.monotonic() > gave_up_at:
                thaw()
            else:
                self.later(0.1, watch)

        self.later(0.1, watch)

    def freeze_anywhere(self, pick: float, duration: float) -> None:
        """SIGSTOP a worker wherever it is (issue 39 item 1): first FLICKERS short
        freezes at random moments, each sampled for locks no server timeout covers, then
        one longer than the database timeout, ended with SIGCONT. A watcher thread does
        the signals and the sampling and cancels the frozen worker's own executions
        (nothing here waits on the database or the API); what it finds is recorded for
        the checker (check_frozen). The heal (here, or at the quiet period) ends it."""
        if self.frozen is not None or not self.cluster.proxied:
            return
        slot = self._slot(pick, lambda s: s.alive and not s.paused)
        if slot is None:
            return
        self.frozen = slot
        seconds = FREEZE_ANYWHERE_S[0] + (FREEZE_ANYWHERE_S[1] - FREEZE_ANYWHERE_S[0]) * duration
        watcher = FrozenWatch(
            self.cluster.database_url,
            slot,
            self.history,
            self.cancel,
            random.Random(pick),
            lambda: self._others_can_work(slot),
        )

        def thaw() -> None:
            watcher.end()
            self.frozen = None

        self.later(FLICKERS * 0.6 + seconds, thaw)
        threading.Thread(
            target=watcher.run, args=(seconds,), name="soak-frozen-watch", daemon=True
        ).start()

    def freeze_at_point(self, pick: float, duration: float, point: str) -> None:
        """Freeze a worker at one of the moments of a unit of work the issue found
        uncovered (writes sent, COMMIT not; reads sent, not fetched): the slot's next
        generation stops itself there (fault action `stop`), stays stopped
        FREEZE_ANYWHERE_S — past the database timeout — and goes on with SIGCONT. The
        watcher judges it as a freeze anywhere."""
        if self.frozen is not None or not self.cluster.proxied:
            return
        slot = self._slot(pick, lambda s: s.alive and not s.paused)
        if slot is None:
            return
        self.frozen = slot
        self.history.fault("kill", slot.worker_id, "to freeze its successor")
        assert slot.proc is not None
        slot.proc.kill()
        self.cluster.spawn(slot, faults=f"{point}=stop")
        self.history.fault("restart", slot.worker_id, f"{point}=stop")
        seconds = FREEZE_ANYWHERE_S[0] + (FREEZE_ANYWHERE_S[1] - FREEZE_ANYWHERE_S[0]) * duration
        watcher = FrozenWatch(
            self.cluster.database_url,
            slot,
            self.history,
            self.cancel,
            random.Random(pick),
            lambda: self._others_can_work(slot),
        )

        def thaw() -> None:
            watcher.end()
            self.frozen = None

        self.later(AT_POINT_WITHIN_S + seconds, thaw)
        threading.Thread(target=watcher.run_at_point, name="soak-frozen-watch", daemon=True).start()

    # ---- network faults ------------------------------------------------------------

    def pg_lock_partition(self, pick: float, duration: float, coin: float) -> None:
        """Partition a worker's database link right after a lock statement (issue 23
        item 2): what it sends still reaches the server (which takes the lock and keeps
        the half-open session), every answer from then on is lost; 2-8 s later the link
        is reset, as a partition whose connection state was lost."""
        slot = self._slot(pick, lambda s: f"{s.index}:pg" not in self._faulted)
        if slot is None:
            return
        name = f"{slot.index}:pg"
        self._faulted.add(name)
        marker = LOCK_MARKERS[int(coin * len(LOCK_MARKERS))]
        seconds = 2.0 + 6.0 * duration
        slot.pg.drop_replies(after=marker)
        self.history.fault("pg_lock_partition", slot.worker_id, f"{marker.decode()} {seconds:.1f}s")

        def heal() -> None:
            slot.pg.cut()
            slot.pg.restore()
            self._faulted.discard(name)
            self.history.fault("pg_heal", slot.worker_id, "reset")

        self.later(seconds, heal)

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


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class WorkTime:
    """A bound counted in seconds in which the rest of the cluster could work, not in wall
    time: while `could_work()` is false (no other worker runs, a server is down) the
    deadline moves on with the clock. check_recovery counts its bound the same way; a
    frozen worker's own executions, cancelled, need another worker's reaper (seed 3912:
    for 8 of its 23 s every other worker was killed, stopped or starting)."""

    def __init__(
        self,
        seconds: float,
        could_work: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.could_work, self.clock = could_work, clock
        self.last = clock()
        self.deadline = self.last + seconds

    def left(self) -> bool:
        """Whether time is left; call it often (the time since the last call is counted
        as idle when the rest could not work)."""
        now = self.clock()
        if not self.could_work():
            self.deadline += now - self.last
        self.last = now
        return now < self.deadline


class FrozenWatch:
    """What a worker frozen anywhere must not do (docs/contract.md#frozen-bound): hold a lock
    in a state no server timeout covers, keep any lock past the timeout, or delay its own
    executions' cancel past OWN_BOUND_S. Findings are faults of kind `frozen_*`; its
    stops are recorded as pauses, so the checker's rules for requests sent around a
    SIGSTOP apply."""

    def __init__(
        self,
        database_url: str,
        slot: WorkerSlot,
        history: History,
        cancel: Callable[[str], None] | None,
        rng: random.Random,
        others_can_work: Callable[[], bool] = lambda: True,
    ) -> None:
        self.others_can_work = others_can_work
        self.database_url = database_url
        self.slot = slot
        self.history = history
        self.cancel = cancel
        self.rng = rng
        self.generation = slot.generation
        self.ended = threading.Event()
        self._signals = threading.Lock()

    def _stop(self, detail: str) -> bool:
        with self._signals:
            if self.ended.is_set() or self.slot.generation != self.generation:
                return False
            self.history.fault("pause", self.slot.worker_id, detail)
            self.slot.signal_group(signal.SIGSTOP)
            self.slot.paused = True
            return True

    def _go_on(self) -> None:
        with self._signals:
            if self.slot.paused and self.slot.generation == self.generation:
                self.slot.signal_group(signal.SIGCONT)
                self.slot.paused = False
                self.history.fault("resume", self.slot.worker_id)

    def end(self) -> None:
        """The heal: no more stops, and the worker runs again."""
        self.ended.set()
        self._go_on()

    def run(self, seconds: float) -> None:
        try:
            with psycopg.connect(self.database_url, autocommit=True, connect_timeout=3) as conn:
                for _ in range(FLICKERS):
                    if self.ended.wait(self.rng.uniform(0.05, 0.3)):
                        return
                    if not self._stop(f"{FLICKER_S}s anywhere"):
                        return
                    try:
                        time.sleep(FLICKER_S)  # the server has run whatever reached it
                        self._sample(conn, any_state=False)
                    finally:
                        self._go_on()
                if self._stop(f"{seconds:.1f}s anywhere"):
                    self._judge(conn, time.monotonic())
        except psycopg.Error as exc:  # a server fault of the run: nothing to judge
            self._go_on()
            self.history.fault("frozen_watch", self.slot.worker_id, f"gave up: {exc}"[:200])

    def run_at_point(self) -> None:
        """The slot's process stops itself at its fault point: judge from there."""
        assert self.slot.proc is not None
        status = Path(f"/proc/{self.slot.proc.pid}/status")
        gave_up_at = time.monotonic() + AT_POINT_WITHIN_S
        while "State:\tT" not in _read(status):
            if self.ended.wait(0.05) or time.monotonic() > gave_up_at:
                return
        with self._signals:
            if self.ended.is_set() or self.slot.generation != self.generation:
                return
            self.history.fault("pause", self.slot.worker_id, "at its fault point")
            self.slot.paused = True
        try:
            with psycopg.connect(self.database_url, autocommit=True, connect_timeout=3) as conn:
                self._judge(conn, time.monotonic())
        except psycopg.Error as exc:  # a server fault of the run: nothing to judge
            self.history.fault("frozen_watch", self.slot.worker_id, f"gave up: {exc}"[:200])

    def _judge(self, conn: psycopg.Connection[Any], started: float) -> None:
        worker = self.slot.worker_id
        if self.ended.wait(1.0):
            return
        self._sample(conn, any_state=False)
        params = {"worker": worker, "ports": sorted(self.slot.pg.upstream_ports())}
        owned = [r[0] for r in conn.execute(OWNED, params).fetchall()]
        self.history.fault("frozen_owns", worker, " ".join(owned))
        budget = WorkTime(OWN_BOUND_S, self.others_can_work)
        for execution_id in owned:
            if self.cancel is not None:
                self.cancel(execution_id)
        while time.monotonic() < started + DB_TIMEOUT_S + 3.0:
            budget.left()  # counted as it goes, not as one stretch
            if self.ended.wait(0.5):
                return
        self._sample(conn, any_state=True)
        while owned and budget.left():
            (ended,) = conn.execute(ENDED, {"ids": owned}).fetchone() or (0,)
            if ended == len(owned) or self.ended.wait(0.5):
                return
        if owned and not self.ended.is_set():
            self.history.fault(
                "frozen_execution_late",
                worker,
                f"{len(owned)} own executions not stopped {OWN_BOUND_S:.0f}s (of time in "
                f"which others could work) after their cancel: {' '.join(owned)}",
            )

    def _sample(self, conn: psycopg.Connection[Any], *, any_state: bool) -> None:
        ports = sorted(self.slot.pg.upstream_ports())
        params = {"ports": ports, "any_state": any_state}
        held = confirmed(lambda: conn.execute(UNCOVERED_LOCKS, params).fetchall())
        if held and self.slot.paused and not self.ended.is_set():
            kind = "frozen_lock_outlived_timeout" if any_state else "frozen_lock_uncovered"
            self.history.fault(kind, self.slot.worker_id, repr(held)[:400])


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
        # Pauses to lift: (when, kind "workflow" / "execution", key or id).
        self.paused: list[tuple[float, str, str]] = []
        self.started_wall = time.time()

    def run(self, stop: threading.Event) -> None:
        _loop(
            stop,
            self.rng,
            self.interval,
            ACTIONS,
            lambda op, *draws: getattr(self, op)(*draws),
            self.resume_due,
        )

    def resume_due(self, everything: bool = False) -> None:
        """Lift the pauses whose time came (all of them at the quiet period)."""
        now = time.monotonic()
        due = [p for p in self.paused if everything or p[0] <= now]
        self.paused = [p for p in self.paused if p not in due]
        base = self.cluster.api_bases[0]
        for _, kind, name in due:
            path = (
                f"/api/v1/workflows/{name}/resume"
                if kind == "workflow"
                else f"/api/v1/executions/{name}/resume"
            )
            self._act(f"resume_{kind}", base, name, path, look=kind == "execution")

    def heal(self) -> None:
        """The quiet period: every pause lifted, every paused execution resumed (the
        ones paused by exhausted retries too), every paused workflow resumed."""
        self.resume_due(everything=True)
        base = self.cluster.api_bases[0]
        for key in OVERLAPS:
            self._act(
                "pause_schedule", base, key, f"/api/v1/workflows/{key}/schedule/pause", look=False
            )
        for key in PAUSABLE:
            self._act("resume_workflow", base, key, f"/api/v1/workflows/{key}/resume", look=False)
        for eid in self._executions(base, ["paused"]):
            self._act("resume_execution", base, eid, f"/api/v1/executions/{eid}/resume")

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
        found = {}
        for s in r.json()["steps"]:
            found[s["id"]] = s["status"]
            # A map's items (docs/contract.md#map) are counted on the page, with a first page of
            # them (the soak's maps have fewer items than a page): their rows' statuses count
            # like steps', for the checker's "asked for" and for resolve.
            for item in (s.get("items") or {}).get("items", []):
                found.update({row["id"]: row["status"] for row in item["steps"]})
        return found

    def _act(
        self,
        action: str,
        base: str,
        execution_id: str,
        path: str,
        body: Any = None,
        *,
        look: bool = True,
        made: Callable[[Any], list[str]] | None = None,
        **extra: Any,
    ) -> int | None:
        """Look at the execution, act on it, record both; the API's status code."""
        at, wall = self.history.now(), time.time()
        before = (self._steps(base, execution_id) or {}) if look else {}
        r = self.client.request("operator", "POST", f"{base}{path}", json=body)
        answered = time.time()
        status = r.status_code if r is not None else None
        created: list[str] = []
        if made is not None and r is not None and status is not None and status < 300:
            created = made(r.json())
        self.history.action(
            OperatorAction(
                at,
                wall,
                action,
                execution_id,
                status,
                steps_before=before,
                answered=answered,
                made=created,
                **extra,
            )
        )
        return status

    def cancel_now(self, execution_id: str) -> None:
        """Cancel this execution (the nemesis's: one a frozen worker holds)."""
        base = self.cluster.api_bases[0]
        path = f"/api/v1/executions/{execution_id}/cancel"
        if self._act("cancel", base, execution_id, path) in (200, 202):
            self.cancelled.append(execution_id)

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

    def retry_parent(self, pick: float, duration: float, coin: float) -> None:
        """Retry a parent (features.PARENT) that failed or waits for an operator, most
        often because its child failed: its workflow step starts a new round, with a new
        child (check_children)."""
        base = self._api(coin)
        found: list[str] = []
        for status in ("failed", "needs_attention"):
            r = self.client.request(
                "operator",
                "GET",
                f"{base}/api/v1/executions?workflow={PARENT}&status={status}&limit=50",
            )
            if r is not None and r.status_code == 200:
                found.extend(item["id"] for item in r.json()["items"])
        if found:
            eid = sorted(found)[int(pick * len(found))]
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

    def complete(self, pick: float, duration: float, coin: float) -> None:
        """Complete (or, one time in four, fail) a waiting wait step by hand."""
        base = self._api(coin)
        waiting = [
            eid
            for eid in self._executions(base, ["waiting", "running"])
            if (self._steps(base, eid) or {}).get("approval") == "waiting"
        ][:20]
        if not waiting:
            return
        eid = waiting[int(pick * len(waiting))]
        if duration < 0.75:
            self._act(
                "complete",
                base,
                eid,
                f"/api/v1/executions/{eid}/steps/approval/complete",
                {"output": {"approved": "by hand"}},
                step_id="approval",
            )
        else:
            self._act(
                "fail_wait",
                base,
                eid,
                f"/api/v1/executions/{eid}/steps/approval/fail",
                step_id="approval",
            )

    def pause_workflow(self, pick: float, duration: float, coin: float) -> None:
        """Pause a workflow for 2-8 s (webhooks still queue; nothing of it starts)."""
        key = PAUSABLE[int(pick * len(PAUSABLE))]
        base = self._api(coin)
        if key in {name for _, kind, name in self.paused if kind == "workflow"}:
            return
        status = self._act(
            "pause_workflow", base, key, f"/api/v1/workflows/{key}/pause", look=False
        )
        if status == 200:
            self.paused.append((time.monotonic() + 2.0 + 6.0 * duration, "workflow", key))

    def pause_execution(self, pick: float, duration: float, coin: float) -> None:
        """Pause a running, waiting or queued execution for 1-8 s."""
        base = self._api(coin)
        live = self._executions(base, ["running", "waiting", "queued"])
        if not live:
            return
        eid = live[int(pick * len(live))]
        status = self._act("pause_execution", base, eid, f"/api/v1/executions/{eid}/pause")
        if status in (200, 202):
            self.paused.append((time.monotonic() + 1.0 + 7.0 * duration, "execution", eid))

    def _replayable(self, base: str, workflow: str, statuses: list[str]) -> list[str]:
        found: list[str] = []
        for status in statuses:
            r = self.client.request(
                "operator",
                "GET",
                f"{base}/api/v1/executions?workflow={workflow}&status={status}&limit=50",
            )
            if r is not None and r.status_code == 200:
                found.extend(item["id"] for item in r.json()["items"])
        return sorted(found)

    def replay(self, pick: float, duration: float, coin: float) -> None:
        """Replay a finished execution from a step past its unsafe POST
        (docs/contract.md#replay)."""
        workflows = sorted(REPLAY_FROM)
        workflow = workflows[int(coin * len(workflows))]
        base = self.cluster.api_bases[0]
        done = self._replayable(base, workflow, ["succeeded", "failed", "cancelled"])
        if not done:
            return
        eid = done[int(pick * len(done))]
        steps = REPLAY_FROM[workflow]
        step = steps[int(duration * len(steps))]
        self._act(
            "replay",
            base,
            eid,
            f"/api/v1/executions/{eid}/replay",
            {"from_step": step, "version": "latest"},
            step_id=step,
            made=lambda answer: [answer["execution_id"]] if "execution_id" in answer else [],
        )

    def bulk_replay(self, pick: float, duration: float, coin: float) -> None:
        """Bulk replay by filter: a dry run, then the confirmed batch (at most 5)."""
        workflow = "orders" if coin < 0.5 else "fanout"
        step = REPLAY_FROM[workflow][0]
        base = self.cluster.api_bases[1 % len(self.cluster.api_bases)]
        flt = {"workflow": workflow, "status": "failed"}
        body = {"filter": flt, "from_step": step, "dry_run": True}
        r = self.client.request("operator", "POST", f"{base}/api/v1/executions/replay", json=body)
        if r is None or r.status_code != 200 or not r.json().get("upto"):
            return
        confirm = {"filter": flt, "from_step": step, "upto": r.json()["upto"], "limit": 5}

        def made(answer: Any) -> list[str]:
            return [str(eid) for eid in answer.get("replayed", [])]

        self._act(
            "bulk_replay",
            base,
            f"bulk:{workflow}",
            "/api/v1/executions/replay",
            confirm,
            look=False,
            step_id=step,
            made=made,
        )

    def reingest(self, pick: float, duration: float, coin: float) -> None:
        """Re-ingest the archived webhooks of a recent range (dry run one time in three)."""
        base = self._api(coin)
        now = time.time()
        start = max(self.started_wall, now - 10.0 - 30.0 * pick)
        iso = lambda t: datetime.fromtimestamp(t, UTC).isoformat()  # noqa: E731
        body = {"from": iso(start), "to": iso(start + 5.0), "dry_run": duration < 0.33}
        self._act(
            "reingest",
            base,
            "workflow:archived",
            "/api/v1/workflows/archived/reingest",
            body,
            look=False,
            made=lambda answer: [str(item["execution_id"]) for item in answer.get("created", [])],
        )

    def close_circuit(self, pick: float, duration: float, coin: float) -> None:
        """Close an open circuit by hand (an operator who knows the host is back)."""
        base = self._api(coin)
        r = self.client.request("operator", "GET", f"{base}/api/v1/circuits")
        if r is None or r.status_code != 200:
            return
        # A workflow's own limit is named with its workflow (docs/reference/http-api.md).
        keys = sorted(
            (str(item["key"]), item.get("workflow") or "") for item in r.json().get("circuits", [])
        )
        if not keys:
            return
        key, workflow = keys[int(pick * len(keys))]
        path = f"/api/v1/circuits/{quote(key, safe=':')}/close"
        if workflow:
            path += f"?workflow={quote(workflow, safe='')}"
        self._act("close_circuit", base, f"circuit:{workflow}/{key}", path, look=False)
