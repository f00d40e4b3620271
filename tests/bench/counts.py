"""What one webhook and one chain3 cost, counted: statements, round trips, commits,
NOTIFYs and bytes on the wire, with process CPU beside them; at 1 and at 8 senders.

    bin/bench --phase counts [--json FILE]          # or: python -m tests.bench.counts

Counts do not move with the other work on a shared machine, so a regression shows as a
number (issue 41: a feature costs nothing where it is not used). It runs on a throwaway
PostgreSQL cluster with pg_stat_statements (statements and NOTIFYs, per statement text),
pg_stat_database (commits, after the 11 s in which idle backends report them) and a
loopback TCP relay in front of it that counts round trips: a client's turn to send after
the server answered. Only bin/api and bin/worker connect through the relay; the bench's
own queries go to the cluster directly and are left out of the statement counts.

Phases, each after a warm-up, the worker's idle polling counted over the same span
and subtracted (`background`, printed):
- `intake`: N webhooks from one sender, no worker: per webhook;
- `chain3 x1`: N chain3 from one sender, worker running: per execution, and per step
  (the execution's cost less the intake's, over its three steps);
- `chain3 x8`: the same from 8 senders, with executions/s from database timestamps.
Beside each phase: the database's sessions by what they wait for (WAITS, sampled from
pg_stat_activity), so that what serialises under concurrent senders — a lock, a hot row,
the WAL, or the client process itself inside its transactions — shows as a share.
A figure, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import requests
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.bench.infra import ADMIN_DATABASE, BenchError, CpuWindow
from tests.bench.session import CHAIN3, Session

STATS_FLUSH_S = 11.0  # PGSTAT_IDLE_INTERVAL (10 s): when an idle backend reports commits
BODY = '{{"order_id": "{i}", "total": 12.5, "customer": "c-{i}", "items": ["sku-1", "sku-2"]}}'
# By queryid (one text may have several: parameter types differ between processes);
# the bench's own statements are its role's, left out.
STATEMENTS = """
SELECT queryid, regexp_replace(query, '\\s+', ' ', 'g'), calls, total_exec_time
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND userid <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
"""
OBSERVER = "ff_bench_observer"
# What every other session of the database is doing at one instant (issue 41.3): waiting on
# a lock (and which statement), on the WAL, on its client (in a transaction: the client's
# CPU or GIL; outside one: idle, left out), or running. Sampled every WAITS_EVERY_S.
WAITS = """
SELECT split_part(application_name, '-', 2),
       CASE WHEN wait_event IS NOT NULL AND wait_event_type <> 'Client'
            THEN wait_event_type || ':' || wait_event
                 || CASE WHEN wait_event_type = 'Lock'
                         THEN ' ' || left(regexp_replace(query, '\\s+', ' ', 'g'), 40)
                         ELSE '' END
            WHEN state = 'active' THEN 'running'
            ELSE 'in transaction, waiting for the client' END
FROM pg_stat_activity
WHERE datname = current_database() AND usename <> %(observer)s
  AND backend_type = 'client backend' AND state NOT IN ('idle', 'disabled')
"""
WAITS_EVERY_S = 0.01
TEXTS: dict[str, str] = {}  # queryid -> a text of it, for the printed table


class CountingRelay:
    """A loopback TCP relay to PostgreSQL that counts round trips and bytes.

    A round trip is a client's send after the server last spoke on that connection (or
    its first send): the pipelined statements of one Sync travel in one turn, however
    many writes the client makes of them."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.round_trips = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self._closed = False
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def snapshot(self) -> tuple[int, int, int]:
        with self.lock:
            return self.round_trips, self.bytes_up, self.bytes_down

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            turn = {"client": False}  # True while the client's current turn lasts
            threading.Thread(
                target=self._pump, args=(client, server, turn, True), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(server, client, turn, False), daemon=True
            ).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, turn: dict[str, bool], up: bool
    ) -> None:
        try:
            while data := src.recv(65536):
                with self.lock:
                    if up:
                        self.bytes_up += len(data)
                        if not turn["client"]:
                            turn["client"] = True
                            self.round_trips += 1
                    else:
                        self.bytes_down += len(data)
                        turn["client"] = False
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@dataclass
class Counted:
    """What a phase cost, in total and per unit (webhook or execution)."""

    name: str
    units: int
    seconds: float
    statements: dict[str, float] = field(default_factory=dict)  # text -> calls
    commits: float = 0.0
    round_trips: float = 0.0
    bytes_up: float = 0.0
    bytes_down: float = 0.0
    cpu_ms: dict[str, float] = field(default_factory=dict)
    per_s: float = 0.0
    exec_ms: float = 0.0  # the statements' time in PostgreSQL (pg_stat_statements)
    waits: dict[str, float] = field(default_factory=dict)  # "process: event" -> share

    def per_unit(self) -> dict[str, Any]:
        n = max(self.units, 1)
        notifies = sum(c for q, c in self.statements.items() if "pg_notify" in TEXTS.get(q, ""))
        return {
            "units": self.units,
            "statements": sum(self.statements.values()) / n,
            "pg_exec_ms": self.exec_ms / n,
            "commits": self.commits / n,
            "round_trips": self.round_trips / n,
            "notifies": notifies / n,
            "bytes_up": self.bytes_up / n,
            "bytes_down": self.bytes_down / n,
            "cpu_ms": {part: ms / n for part, ms in self.cpu_ms.items()},
            "per_s": self.per_s,
            "waits": self.waits,
        }


class WaitSampler:
    """Samples WAITS from a thread and connection of its own while a phase runs; `shares`
    then holds each (process, event)'s sessions on average (0.5: half a session busy
    with it throughout)."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(make_conninfo(url, user=OBSERVER), autocommit=True)
        self.counts: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(WAITS_EVERY_S):
            self.samples += 1
            for process, event in self.conn.execute(WAITS, {"observer": OBSERVER}):
                key = f"{process or '?'}: {event}"
                self.counts[key] = self.counts.get(key, 0) + 1

    def stop(self) -> tuple[dict[str, float], int]:
        """The shares, and the queries this sampler ran (each an autocommitted commit)."""
        self._stop.set()
        self._thread.join()
        self.conn.close()
        n = max(self.samples, 1)
        ranked = sorted(self.counts.items(), key=lambda kv: -kv[1])
        return {k: c / n for k, c in ranked}, self.samples


class Counter:
    """Reads the counters before and after a block of work."""

    def __init__(self, session: Session, relay: CountingRelay, sessions: dict[str, int]) -> None:
        self.s = session
        self.relay = relay
        self.sessions = sessions
        # The bench's own reads, as a role of their own (left out of the statements) and
        # counted (left out of the commits).
        session.conn.execute(f"CREATE ROLE {OBSERVER} LOGIN SUPERUSER")
        self.observer = psycopg.connect(
            make_conninfo(session.db.url, user=OBSERVER), autocommit=True
        )
        session.stack.callback(self.observer.close)
        self.queries = 0
        self.exec_ms = 0.0

    def scalar_row(self, sql: str, params: Any = None) -> Any:
        self.queries += 1
        return self.observer.execute(sql, params).fetchone()

    def _commits(self) -> int:
        time.sleep(STATS_FLUSH_S)  # every idle backend has reported by now
        self.observer.execute("SELECT pg_stat_force_next_flush()")
        return int(
            self.scalar_row(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )[0]
        )

    def _statements(self) -> dict[str, float]:
        rows = self.observer.execute(STATEMENTS).fetchall()
        self.exec_ms = sum(float(ms) for *_, ms in rows)
        # Keyed by queryid alone: its text is whichever the server saw first after a
        # reset (literals or $n), and the idle span's must cancel the phase's.
        for queryid, q, _, _ in rows:
            TEXTS.setdefault(str(queryid), q)
        return {str(queryid): float(c) for queryid, _, c, _ in rows}

    @contextmanager
    def count(self, name: str, units: int) -> Iterator[Counted]:
        commits = self._commits()
        self.observer.execute("SELECT pg_stat_statements_reset()")
        self.queries = 0
        trips, up, down = self.relay.snapshot()
        result = Counted(name, units, 0.0)
        started = time.monotonic()
        sampler = WaitSampler(self.s.db.url) if units else None
        with CpuWindow(self.sessions) as cpu:
            yield result
        result.seconds = time.monotonic() - started
        sampled = 0
        if sampler is not None:
            result.waits, sampled = sampler.stop()
        t2, u2, d2 = self.relay.snapshot()
        result.round_trips, result.bytes_up, result.bytes_down = t2 - trips, u2 - up, d2 - down
        result.statements = self._statements()
        result.exec_ms = self.exec_ms
        polls = self.queries + sampled
        # Our own since the first reading: the polls, the reset, the statements, the
        # flush requests (each autocommitted, each a commit).
        result.commits = self._commits() - commits - polls - 4
        result.cpu_ms = {k: v for k, v in cpu.groups.items() if k in self.sessions}


def _send(url: str, count: int, senders: int, prefix: str) -> None:
    """`count` chain3 webhooks from `senders` threads, each with its own HTTP session."""
    failures: list[str] = []

    def run(index: int) -> None:
        http = requests.Session()
        for i in range(index, count, senders):
            r = http.post(
                url,
                data=BODY.format(i=i),
                headers={"Content-Type": "application/json", "Idempotency-Key": f"{prefix}-{i}"},
                timeout=30,
            )
            if r.status_code != 202:
                failures.append(f"{r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=run, args=(k,)) for k in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise BenchError(f"{len(failures)} webhooks refused, first: {failures[0]}")


def _wait_done(counter: Counter, workflow_id: int, expected: int) -> float:
    """Wait until `expected` executions succeeded; their executions/s from DB timestamps."""
    deadline = time.monotonic() + 300
    while True:
        row = counter.scalar_row(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status "
            "NOT IN ('succeeded', 'failed', 'cancelled', 'needs_attention')), "
            "extract(epoch FROM max(finished_at) - min(created_at)) "
            "FROM executions WHERE workflow_id = %s",
            (workflow_id,),
        )
        if row[0] >= expected and row[1] == 0:
            return float(row[0]) / max(float(row[2] or 0.0), 1e-9)
        if row[1] == 0 and row[0] < expected:
            raise BenchError(f"only {row[0]} of {expected} executions succeeded")
        if time.monotonic() > deadline:
            raise BenchError(f"{row[1]} executions still live after 300 s")
        time.sleep(0.05)


def _subtract(work: Counted, idle: Counted) -> Counted:
    """The phase's counts less the worker's idle polling over the same span."""
    scale = work.seconds / max(idle.seconds, 1e-9)
    statements = dict(work.statements)
    for q, c in idle.statements.items():
        statements[q] = statements.get(q, 0.0) - c * scale
    return Counted(
        work.name,
        work.units,
        work.seconds,
        {q: c for q, c in statements.items() if abs(c) > 1e-9},
        work.commits - idle.commits * scale,
        work.round_trips - idle.round_trips * scale,
        work.bytes_up - idle.bytes_up * scale,
        work.bytes_down - idle.bytes_down * scale,
        work.cpu_ms,
        work.per_s,
        work.exec_ms - idle.exec_ms * scale,
        work.waits,
    )


def run(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """Every phase; returns the report (tables and per-statement detail)."""
    n = 100 if args.quick else 300
    report: dict[str, Any] = {"n": n}
    args.own_postgres = True  # pg_stat_statements is loaded there
    with Session.from_args(args) as s:
        s.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        relay = CountingRelay(int(conninfo_to_dict(s.db.url)["port"]))
        s.stack.callback(relay.close)
        s.extra_env["FLOWFORGE_DATABASE_URL"] = make_conninfo(s.db.url, port=str(relay.port))
        s.start_api()
        assert s.api is not None
        workflow = s.publish("chain3", CHAIN3)
        url = s.hook_url("chain3")
        assert s.own_server is not None  # its backends are one session: the postmaster's
        counter = Counter(s, relay, {"api": s.api.pid, "postgres": s.own_server.proc.pid})
        _send(url, 5 * s.api_workers, s.api_workers, f"warm-{uuid.uuid4().hex[:6]}")
        with counter.count("intake", n) as intake:
            _send(url, n, 1, f"in-{uuid.uuid4().hex[:6]}")
        s.reset()
        worker = s.start_worker()
        counter.sessions["worker"] = worker.pid
        _send(url, 50, 1, f"warm-{uuid.uuid4().hex[:6]}")
        _wait_done(counter, workflow.workflow_id, 50)
        s.reset()
        phases = {"intake": intake}
        for senders in (1, 8):
            with counter.count("idle", 0) as idle:
                time.sleep(5.0)
            with counter.count(f"chain3 x{senders}", n) as chain:
                _send(url, n, senders, f"c{senders}-{uuid.uuid4().hex[:6]}")
                chain.per_s = _wait_done(counter, workflow.workflow_id, n)
            phases[f"background x{senders}"] = idle
            phases[f"chain3 x{senders}"] = _subtract(chain, idle)
            log(f"chain3 x{senders}: {phases[f'chain3 x{senders}'].per_unit()}")
            s.reset()
    report["phases"] = {name: c.per_unit() for name, c in phases.items()}
    report["statements"] = {
        name: {
            f"{q} {TEXTS.get(q, '')}": calls / max(counted.units, 1)
            for q, calls in sorted(counted.statements.items(), key=lambda x: -x[1])
        }
        for name, counted in phases.items()
    }
    per_webhook = report["phases"]["intake"]
    for senders in (1, 8):
        chain = report["phases"][f"chain3 x{senders}"]
        report["phases"][f"per step x{senders}"] = {
            k: (chain[k] - per_webhook[k]) / 3
            for k in (
                "statements",
                "commits",
                "round_trips",
                "notifies",
                "bytes_up",
                "bytes_down",
                "pg_exec_ms",
            )
        }
    return report


def table(report: dict[str, Any]) -> str:
    """The readable summary: one row per phase, then each phase's statements."""
    keys = ("statements", "round_trips", "commits", "notifies", "bytes_up", "bytes_down")
    keys += ("pg_exec_ms",)
    lines = [f"\n[counts] N={report['n']} per unit (webhook, chain3 execution or step)"]
    lines.append(f"  {'phase':<16}" + "".join(f"{k:>12}" for k in keys) + "  CPU ms, per_s")
    for name, p in report["phases"].items():
        if name.startswith("background"):
            continue
        cpu = ", ".join(f"{k} {v:.2f}" for k, v in p.get("cpu_ms", {}).items())
        rate = f", {p['per_s']:.0f}/s" if p.get("per_s") else ""
        lines.append(
            f"  {name:<16}" + "".join(f"{p[k]:>12.2f}" for k in keys) + f"  {cpu}{rate}".rstrip()
        )
    for name, p in report["phases"].items():
        if p.get("waits"):
            lines.append(f"\n  PostgreSQL sessions by what they wait for, {name} (average):")
            for event, share in list(p["waits"].items())[:12]:
                lines.append(f"    {share:6.2f}  {event[:100]}")
    for name, statements in report["statements"].items():
        if name.startswith("background"):
            continue
        lines.append(f"\n  statements per unit, {name}:")
        for q, c in statements.items():
            if abs(c) >= 0.005:
                lines.append(f"    {c:6.2f}  {q[:110]}")
    return "\n".join(lines)


def main() -> None:
    """Run the counts alone; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="N=100 instead of 300")
    p.add_argument("--json", type=Path)
    p.add_argument("--api-workers", type=int, default=5)
    p.add_argument("--worker-concurrency", type=int, default=8)
    p.add_argument("--admin-url", default=ADMIN_DATABASE)
    p.add_argument("--keep-logs", action="store_true")
    args = p.parse_args()
    args.profile = None
    report = run(args, lambda m: print(f"bench: {m}", file=sys.stderr, flush=True))
    print(table(report), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
