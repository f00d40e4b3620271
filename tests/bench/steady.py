"""bin/bench --phase steady: FlowForge at the load most users have, not at saturation.

Issue 17's table shape, in one run on one machine:

- one sequential sender at 20/s and at 60/s, open loop (a request leaves at its due
  time, or at once when the one before it answered late), submit -> done latency on
  the client's clock;
- one and eight senders as fast as they go (closed loop): executions per second,
  latency and machine CPU per execution;
- CPU split per process group (API gunicorn, worker, this database's PostgreSQL
  backends, PostgreSQL's shared background processes, RabbitMQ) from /proc;
- the same sequential sender at 60/s against a bare Flask endpoint that parses the same
  JSON body and makes the same two inserts on bin/api's gunicorn command line
  (tests/bench/bare_app.py): the API's and the worker's CPU against that;
- a sequential webhook round trip against `GET /healthz` on the same server.

How the client knows "done": a trigger in the bench's private database sends
pg_notify('bench_done', id) when an execution becomes terminal; the bench LISTENs on
one connection and stamps each notification with its own monotonic clock as it
arrives. PostgreSQL delivers a NOTIFY only after its transaction committed, so the
stamp is taken after the whole path (webhook, relay, broker, worker, checkpoint
commit) and a network hop back, like a callback would, without a fourth step in the
workflow (an HTTP step would change what is measured) and without polling (which
costs the database more than the thing measured). The trigger's cost, one NOTIFY per
execution, is PostgreSQL CPU and counted as such.

The peers of the issue (Procrastinate, Celery, DBOS) are not installed: their figures
are issue 17's, measured on this machine earlier, and the comparison with them is only
as good as that. Ratios against the bare Flask baseline are measured in this run.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psycopg

from tests.bench.infra import BenchError, machine_cpu_ms, process_table
from tests.bench.limits import BareFlask
from tests.bench.load import post_webhook
from tests.bench.session import CHAIN3, Session

# Issue 17's peers behind the same Flask endpoint on the same gunicorn, not re-measured:
# (executions/s, machine CPU ms per execution), one sender and eight.
PEERS = {
    "Procrastinate": ((62.0, 24.3), (62.8, 23.8)),
    "Celery prefork": ((51.6, 33.3), (50.8, 34.5)),
    "DBOS queue": ((37.9, 38.0), (33.6, 40.3)),
}


@dataclass(frozen=True)
class Plan:
    """How much each segment sends."""

    roundtrips: int = 300
    slow_s: float = 15.0  # at 20/s
    steady_s: float = 20.0  # at 60/s, FlowForge and bare Flask each
    sequential: int = 1000  # one sender, closed loop
    parallel: int = 2000  # eight senders, closed loop
    repetitions: int = 3  # each figure is the median of the rounds


FULL = Plan()
QUICK = Plan(roundtrips=150, slow_s=8.0, steady_s=10.0, sequential=400, parallel=800, repetitions=1)

DONE_CHANNEL = "bench_done"
DONE_TRIGGER = f"""
CREATE FUNCTION bench_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{DONE_CHANNEL}', NEW.id::text);
    RETURN NULL;
END $$;
CREATE TRIGGER bench_done AFTER UPDATE OF status ON executions FOR EACH ROW
WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled', 'needs_attention')
      AND OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION bench_done();
"""

# PostgreSQL's own background processes: shared by every database on the server.
PG_SHARED = (
    "SELECT pid FROM pg_stat_activity WHERE backend_type IN ('walwriter', 'checkpointer', "
    "'background writer', 'autovacuum launcher', 'logical replication launcher', "
    "'walsummarizer', 'io worker')"
)
PG_OURS = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
RABBIT = frozenset({"beam.smp", "erl_child_setup", "inet_gethost", "epmd"})


# ---- the client's view: submit and done, on one clock ---------------------------------


class DoneListener:
    """LISTEN bench_done on its own connection; stamps each execution when it is done."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(f"LISTEN {DONE_CHANNEL}")
        self.backend_pid = self.conn.info.backend_pid
        self.done: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="done-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for note in self.conn.notifies(timeout=0.2):
                at = time.monotonic()
                with self._lock:
                    self.done[note.payload] = at

    def wait(self, ids: list[str], timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                missing = [i for i in ids if i not in self.done]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"{len(missing)} executions not done after {timeout_s}s")
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.conn.close()


def post(host: str, port: int, path: str, key: str) -> tuple[int, str]:
    """One webhook on a new connection (gunicorn's sync workers close each one anyway)."""
    status, body = post_webhook(host, port, path, key)
    if status != 202:
        raise BenchError(f"{path} answered {status}: {body[:300]!r}")
    return status, str(json.loads(body)["execution_id"])


def get(host: str, port: int, path: str) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise BenchError(f"{path} answered {response.status}")


@dataclass
class Sent:
    """What one segment sent: per execution, when it was due and when it was answered."""

    due: dict[str, float] = field(default_factory=dict)
    answered_ms: list[float] = field(default_factory=list)
    late_ms: list[float] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0


def open_loop_sequential(url: str, rate: float, duration_s: float) -> Sent:
    """One sender at `rate`: each request leaves at its due time, or as soon as the one
    before it was answered if that was later. Latency counts from the due time, so a
    slow answer shows in the next request's latency instead of slowing arrivals down."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    count = max(1, int(rate * duration_s))
    prefix = uuid.uuid4().hex[:8]
    sent = Sent(started=time.monotonic() + 0.05)
    for i in range(count):
        due = sent.started + i / rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        left = time.monotonic()
        sent.late_ms.append(max(0.0, left - due) * 1000)
        _, execution_id = post(host, port, parts.path, f"{prefix}-{i}")
        sent.answered_ms.append((time.monotonic() - left) * 1000)
        sent.due[execution_id] = due
    sent.finished = time.monotonic()
    return sent


def closed_loop(url: str, senders: int, count: int) -> Sent:
    """`senders` threads, each sending its next webhook as soon as the last was answered."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    prefix = uuid.uuid4().hex[:8]
    sent = Sent()
    lock = threading.Lock()
    counter = iter(range(count))

    def sender() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            left = time.monotonic()
            _, execution_id = post(host, port, parts.path, f"{prefix}-{i}")
            answered = time.monotonic()
            with lock:
                sent.due[execution_id] = left
                sent.answered_ms.append((answered - left) * 1000)

    threads = [threading.Thread(target=sender, name=f"sender-{n}") for n in range(senders)]
    sent.started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sent.finished = time.monotonic()
    return sent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# ---- CPU per process group ---------------------------------------------------------------


class GroupCpu:
    """CPU of each process group over a window, from /proc.

    PostgreSQL is split in two: the backends connected to this run's database (the API's
    and the worker's pools, the relay's listener; the bench's own two connections are
    counted as load), and the server's shared background processes (WAL writer,
    checkpointer, ...), which on a shared server also work for other databases, as
    RabbitMQ does for other vhosts. Only a quiet machine makes those two exact.
    """

    def __init__(self, session: Session, sessions: dict[str, int], bench_pids: set[int]) -> None:
        self.session = session
        self.sessions = sessions
        self.bench_pids = bench_pids

    def _pids(self, sql: str) -> set[int]:
        return {row[0] for row in self.session.conn.execute(sql).fetchall()}

    @contextmanager
    def window(self) -> Iterator[dict[str, float]]:
        groups: dict[str, float] = {}
        ours = self._pids(PG_OURS) - self.bench_pids
        shared = self._pids(PG_SHARED)
        start_total, start_irq = machine_cpu_ms()
        start = process_table()
        start_self = _self_cpu_ms()
        yield groups
        total, irq = machine_cpu_ms()
        end = process_table()
        ours |= self._pids(PG_OURS) - self.bench_pids
        by_session = {sid: name for name, sid in self.sessions.items()}
        groups.update({name: 0.0 for name in self.sessions})
        groups.update(pg_backends=0.0, pg_shared=0.0, rabbitmq=0.0)
        for pid, now in end.items():
            before = start.get(pid)
            spent = now.cpu_ms - (before.cpu_ms if before and before.comm == now.comm else 0.0)
            if now.session in by_session:
                groups[by_session[now.session]] += spent
            elif pid in ours:
                groups["pg_backends"] += spent
            elif pid in shared:
                groups["pg_shared"] += spent
            elif now.comm in RABBIT:
                groups["rabbitmq"] += spent
        bench_pg = sum(
            end[p].cpu_ms - (start[p].cpu_ms if p in start else 0.0)
            for p in self.bench_pids
            if p in end
        )
        groups["load"] = _self_cpu_ms() - start_self + bench_pg
        groups["irq"] = irq - start_irq
        groups["total"] = total - start_total
        groups["other"] = max(
            0.0, groups["total"] - sum(v for k, v in groups.items() if k != "total")
        )


def _self_cpu_ms() -> float:
    t = time.process_time()
    return t * 1000.0


SERVICES = ("api", "worker", "pg_backends", "pg_shared", "rabbitmq")


def _per(groups: dict[str, float], n: int) -> dict[str, float]:
    return {k: v / max(n, 1) for k, v in groups.items()}


# ---- the segments ------------------------------------------------------------------------


def _latency(sent: Sent, listener: DoneListener) -> dict[str, float]:
    ids = list(sent.due)
    listener.wait(ids)
    lat = [(listener.done[i] - sent.due[i]) * 1000 for i in ids]
    last_done = max(listener.done[i] for i in ids)
    return {
        "executions": len(ids),
        "per_s": len(ids) / (last_done - sent.started),
        "p50_ms": percentile(lat, 0.5),
        "p99_ms": percentile(lat, 0.99),
        "answer_p50_ms": percentile(sent.answered_ms, 0.5),
        "answer_p99_ms": percentile(sent.answered_ms, 0.99),
        "late_p99_ms": percentile(sent.late_ms, 0.99) if sent.late_ms else 0.0,
    }


def _measured(
    name: str,
    cpu: GroupCpu,
    listener: DoneListener,
    send: Callable[[], Sent],
    log: Callable[[str], None],
) -> dict[str, Any]:
    with cpu.window() as groups:
        sent = send()
        listener.wait(list(sent.due))
    result = _latency(sent, listener)
    per = _per(groups, result["executions"])
    result["cpu_ms"] = per
    result["services_cpu_ms"] = sum(per[k] for k in SERVICES)
    log(
        f"{name}: {result['per_s']:.1f}/s, p50 {result['p50_ms']:.1f} / p99 "
        f"{result['p99_ms']:.1f} ms, {result['services_cpu_ms']:.2f} ms CPU "
        f"({', '.join(f'{k} {per[k]:.2f}' for k in (*SERVICES, 'load', 'other'))})"
    )
    return result


def roundtrips(session: Session, count: int) -> dict[str, float]:
    """Sequential GET /healthz and POST /hooks/chain3, interleaved, worker running."""
    parts = urlsplit(session.api_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    hook_path = urlsplit(session.hook_url("chain3")).path
    prefix = uuid.uuid4().hex[:8]
    health: list[float] = []
    hook: list[float] = []
    for i in range(count):
        started = time.monotonic()
        get(host, port, "/healthz")
        health.append((time.monotonic() - started) * 1000)
        started = time.monotonic()
        post(host, port, hook_path, f"rt-{prefix}-{i}")
        hook.append((time.monotonic() - started) * 1000)
        time.sleep(0.01)  # let the worker run this one, so the next round trip is alone
    return {
        "healthz_ms": statistics.median(health),
        "webhook_ms": statistics.median(hook),
        "ratio": statistics.median(hook) / statistics.median(health),
    }


def bare_roundtrip(url: str, count: int) -> float:
    """Median sequential round trip of the bare Flask insert (its commit included)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    prefix = uuid.uuid4().hex[:8]
    took = []
    for i in range(count):
        started = time.monotonic()
        post(host, port, parts.path, f"bare-rt-{prefix}-{i}")
        took.append((time.monotonic() - started) * 1000)
        time.sleep(0.01)
    return statistics.median(took)


def run(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """The whole steady phase, in its own private database and vhost: `repetitions`
    rounds of every segment (bare Flask, then FlowForge), each figure the median of its
    rounds (issue 17's table is a median of three). A round's ratios come from that
    round's own measurements, seconds apart."""
    plan = QUICK if args.quick else FULL
    started = time.monotonic()
    report: dict[str, Any] = {"plan": plan.__dict__, "peers": "issue 17, not re-measured"}
    with Session.from_args(args) as s:
        s.start_api()
        s.publish("chain3", CHAIN3)
        s.conn.execute(DONE_TRIGGER)
        listener = DoneListener(s.db.url)
        s.stack.callback(listener.close)
        bench_pids = {s.conn.info.backend_pid, listener.backend_pid}
        rounds = []
        for n in range(plan.repetitions):
            log(f"round {n + 1} of {plan.repetitions}")
            rounds.append(_round(s, plan, listener, bench_pids, log, profile=n == 0))
        report["rounds"] = rounds
        report.update(_medians(rounds))
        report["failed_executions"] = sum(r["failed_executions"] for r in rounds)
    report["targets"] = targets(report)
    report["duration_s"] = round(time.monotonic() - started, 1)
    return report


def _round(
    s: Session,
    plan: Plan,
    listener: DoneListener,
    bench_pids: set[int],
    log: Callable[[str], None],
    *,
    profile: bool,
) -> dict[str, Any]:
    """One round of every segment; the worker runs only for FlowForge's."""
    assert s.api is not None
    report: dict[str, Any] = {}
    # Bare Flask first, with no worker: its outbox rows wake nothing.
    bare = BareFlask(s)
    bare_cpu = GroupCpu(s, {"bare": bare.server.pid}, bench_pids)
    open_loop_sequential(bare.url, 60, 2)  # warm-up
    with bare_cpu.window() as groups:
        sent = open_loop_sequential(bare.url, 60, plan.steady_s)
    bare_per = _per(groups, len(sent.due))
    report["bare_60"] = {
        "cpu_ms": bare_per,
        "requests": len(sent.due),
        # The floor of a webhook round trip: the same commit behind bare Flask.
        "roundtrip_ms": bare_roundtrip(bare.url, plan.roundtrips),
    }
    log(f"bare Flask at 60/s: {bare_per['bare']:.2f} ms gunicorn CPU per request")
    bare.stop()
    s.reset()

    worker = s.start_worker()
    cpu = GroupCpu(s, {"api": s.api.pid, "worker": worker.pid}, bench_pids)
    url = s.hook_url("chain3")
    _latency(open_loop_sequential(url, 20, 3), listener)  # warm-up, not counted

    report["roundtrip"] = roundtrips(s, plan.roundtrips)
    rt = report["roundtrip"]
    log(
        f"round trip: webhook {rt['webhook_ms']:.2f} ms, /healthz {rt['healthz_ms']:.2f} ms"
        f" ({rt['ratio']:.2f}x)"
    )
    report["open_20"] = _measured(
        "1 sender at 20/s",
        cpu,
        listener,
        lambda: open_loop_sequential(url, 20, plan.slow_s),
        log,
    )
    with (
        s.py_spy("steady60-api", s.api.pid, subprocesses=True) if profile else nullcontext(),
        s.py_spy("steady60-worker", worker.pid) if profile else nullcontext(),
        s.statements("steady60") if profile else nullcontext(),
    ):
        report["open_60"] = _measured(
            "1 sender at 60/s",
            cpu,
            listener,
            lambda: open_loop_sequential(url, 60, plan.steady_s),
            log,
        )
    report["senders_1"] = _measured(
        "1 sender, closed loop",
        cpu,
        listener,
        lambda: closed_loop(url, 1, plan.sequential),
        log,
    )
    report["senders_8"] = _measured(
        "8 senders, closed loop",
        cpu,
        listener,
        lambda: closed_loop(url, 8, plan.parallel),
        log,
    )
    report["ratios"] = {
        "api_vs_bare": report["open_60"]["cpu_ms"]["api"] / bare_per["bare"],
        "worker_vs_bare": report["open_60"]["cpu_ms"]["worker"] / bare_per["bare"],
    }
    report["failed_executions"] = s.scalar(
        "SELECT count(*) FROM executions WHERE status <> 'succeeded'"
    )
    s.stop_worker()
    s.reset()
    return report


def _medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Every number of the rounds' reports, as the median over the rounds (same shape)."""
    first = rounds[0]
    if isinstance(first, dict):
        return {key: _medians([r[key] for r in rounds]) for key in first}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return statistics.median(rounds)
    return first


# ---- judging -------------------------------------------------------------------------------


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of issue 17 that this phase measures, met or not, with its figures."""
    # The best peer at each sender count is the fastest one there.
    best = [max(peer[n] for peer in PEERS.values()) for n in (0, 1)]
    s60, bare = report["open_60"], report["bare_60"]["cpu_ms"]["bare"]
    ratios = report["ratios"]
    rows = []
    for n, seg in ((0, "senders_1"), (1, "senders_8")):
        peer_rate, peer_cpu = best[n]
        got = report[seg]
        label = "1 sender" if n == 0 else "8 senders"
        rows.append(
            _row(f"{label}: executions/s", got["per_s"], ">=", 2 * peer_rate,
                 f"2x best peer's {peer_rate} (issue 17)")
        )  # fmt: skip
        rows.append(
            _row(f"{label}: machine CPU ms per execution", got["services_cpu_ms"], "<=",
                 peer_cpu / 3, f"1/3 of best peer's {peer_cpu} (issue 17)")
        )  # fmt: skip
    rows.append(
        _row("CPU ms per chain3 at 60/s", s60["services_cpu_ms"], "<=", 8.0,
             "API + worker + PostgreSQL + RabbitMQ, load generator excluded")
    )  # fmt: skip
    rows.append(
        _row("API CPU per webhook / bare Flask", ratios["api_vs_bare"], "<=", 1.3,
             f"{s60['cpu_ms']['api']:.2f} vs {bare:.2f} ms, both at 60/s")
    )  # fmt: skip
    rows.append(
        _row("worker CPU per chain3 / bare Flask", ratios["worker_vs_bare"], "<=", 1.0,
             f"{s60['cpu_ms']['worker']:.2f} vs {bare:.2f} ms")
    )  # fmt: skip
    rt = report["roundtrip"]
    rows.append(
        _row("webhook round trip / /healthz", rt["ratio"], "<=", 1.3,
             f"{rt['webhook_ms']:.2f} vs {rt['healthz_ms']:.2f} ms, sequential; bare Flask's "
             f"insert {report['bare_60']['roundtrip_ms']:.2f} ms")
    )  # fmt: skip
    s20 = report["open_20"]
    rows.append(_row("p50 submit->done at 20/s, ms", s20["p50_ms"], "<=", 5.0, "client clock"))
    rows.append(_row("p99 submit->done at 20/s, ms", s20["p99_ms"], "<=", 12.0, "client clock"))
    return rows


def _row(name: str, value: float, op: str, target: float, note: str) -> dict[str, Any]:
    met = value >= target if op == ">=" else value <= target
    return {
        "figure": name,
        "value": value,
        "target": f"{op} {target:.3g}",
        "met": met,
        "note": note,
    }


def table(report: dict[str, Any]) -> str:
    """The readable summary: issue 17's table shape, the CPU split, the targets."""
    rounds = len(report.get("rounds", [])) or 1
    lines = ["", f"[steady: median of {rounds} round(s) in one run, peers' figures from issue 17]"]
    lines.append(
        f"  {'segment':<24}{'exec/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'CPU ms':>8}   "
        "api / worker / pg backends / pg shared / rabbitmq | load, other"
    )
    for key, name in (
        ("open_20", "1 sender at 20/s"),
        ("open_60", "1 sender at 60/s"),
        ("senders_1", "1 sender, closed loop"),
        ("senders_8", "8 senders, closed loop"),
    ):
        seg = report[key]
        c = seg["cpu_ms"]
        split = " / ".join(f"{c[k]:.2f}" for k in SERVICES)
        lines.append(
            f"  {name:<24}{seg['per_s']:>8.1f}{seg['p50_ms']:>8.1f}{seg['p99_ms']:>8.1f}"
            f"{seg['services_cpu_ms']:>8.2f}   {split} | {c['load']:.2f}, {c['other']:.2f}"
        )
    for peer, ((r1, c1), (r8, c8)) in PEERS.items():
        lines.append(
            f"  {peer + ' (issue 17)':<24}{r1:>8.1f}{'':>16}{c1:>8.1f}   8 senders: {r8}/s, {c8} ms"
        )
    bare = report["bare_60"]["cpu_ms"]
    lines.append(
        f"  bare Flask at 60/s: {bare['bare']:.2f} ms gunicorn CPU per request, "
        f"{bare['pg_backends']:.2f} ms PostgreSQL backends; sequential round trip "
        f"{report['bare_60']['roundtrip_ms']:.2f} ms"
    )
    if report.get("failed_executions"):
        lines.append(f"  WARNING: {report['failed_executions']} executions did not succeed")
    lines.append("\n[steady targets]")
    width = max(len(t["figure"]) for t in report["targets"]) + 2
    for t in report["targets"]:
        verdict = "met" if t["met"] else "NOT met"
        lines.append(
            f"  {t['figure']:<{width}}{t['value']:>8.2f}  {t['target']}: {verdict}  ({t['note']})"
        )
    lines.append(f"\nsteady phase took {report['duration_s']:.0f}s")
    return "\n".join(lines)
