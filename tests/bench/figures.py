"""FlowForge's own figures: intake, relay, end-to-end executions, latency, memory.

Throughput of executions is read from the database, not from the load generator:
(executions finished) / (last finished_at - first created_at), so it covers the whole
path, webhook to last checkpoint, and cannot be flattered by an early stop.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flowforge.store.db import create_pool
from flowforge.worker.broker import Topology
from flowforge.worker.relay import Relay
from tests.bench.infra import BenchError, CpuWindow
from tests.bench.load import open_loop, wrk, wrk_count
from tests.bench.session import Session

# An idle backend that reported less than a second ago reports again only after
# PGSTAT_IDLE_INTERVAL (10 s): pg_stat_database lags the truth by up to that much.
STATS_FLUSH_S = 11.0


def webhook_per_s(session: Session, connections: int, duration_s: float) -> dict[str, float]:
    """202s per second from POST /hooks/chain3, the worker not running (intake alone)."""
    if session.worker is not None:
        raise BenchError("webhook_per_s measures intake alone: stop the worker first")
    session.reset()
    session.stats_dirty = True
    url = session.hook_url("chain3")
    wrk(url, connections, 1, f"warm-{uuid.uuid4().hex[:6]}")
    name = f"webhook-{uuid.uuid4().hex[:4]}"
    with (
        session.py_spy(f"api-{name}", session.api.pid, True),
        session.statements(name),
        CpuWindow({"api": session.api.pid}) as cpu,
    ):
        result = wrk(url, connections, duration_s, f"hook-{uuid.uuid4().hex[:6]}")
    stored = session.scalar("SELECT count(*) FROM idempotency_keys")
    if stored < result.accepted:
        raise BenchError(f"wrk counted {result.accepted} 202s but only {stored} were stored")
    return {
        "per_s": result.accepted_per_s,
        "errors": result.errors + (result.requests - result.accepted),
        "wrk_p50_ms": result.latency_p50_ms,
        "wrk_p99_ms": result.latency_p99_ms,
        # Machine CPU per accepted webhook, other users of the machine left out: steadier
        # than the rate when the machine is shared.
        "cpu_ms_own": cpu.own_ms / max(result.accepted, 1),
    }


def relay_per_s(session: Session, rows: int) -> dict[str, float]:
    """Drain a `rows` outbox backlog with FlowForge's Relay, in-process, no consumer."""
    session.reset()
    session.stats_dirty = True
    session.conn.execute(
        "INSERT INTO outbox (execution_id, step_id) "
        "SELECT gen_random_uuid(), 'a' FROM generate_series(1, %s)",
        (rows,),
    )
    session.conn.execute("VACUUM ANALYZE outbox")
    topology = Topology(f"relay-{uuid.uuid4().hex[:6]}")  # nobody consumes this queue
    pool = create_pool(session.db.url, max_size=2, name="bench-relay")
    pool.open(wait=True, timeout=30)
    stop = threading.Event()
    relay = Relay(pool, session.db.url, session.vhost.url, topology, stop)
    try:
        started = time.monotonic()
        relay.start()
        deadline = started + 600
        while relay.published < rows:
            if not relay.is_alive() or time.monotonic() > deadline:
                raise BenchError(f"relay stalled after {relay.published} of {rows}")
            time.sleep(0.005)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        relay.join(30)
        pool.close()
    left = session.scalar("SELECT count(*) FROM outbox")
    depth = session.queue_depth(topology.queue)
    if left or depth < rows:
        raise BenchError(f"relay left {left} outbox rows; queue holds {depth} of {rows}")
    session.purge_queue(topology.queue)
    # At-least-once allows duplicates, but a relay that makes them unprovoked is news.
    return {"per_s": rows / elapsed, "duplicates": depth - rows}


@dataclass
class ExecutionRun:
    """One batch of executions driven end to end."""

    per_s: float
    executions: int
    failed: int
    commits_per_execution: float
    write_tx_per_execution: float
    cpu_ms_per_execution: float
    cpu_ms_by_part: dict[str, float]
    worker_rss_peak_mb: float
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def _wait_finished(session: Session, workflow_id: int, timeout_s: float) -> int:
    """Poll until no execution of the workflow is live; returns the polls made."""
    polls = 0
    deadline = time.monotonic() + timeout_s
    while True:
        polls += 1
        live = session.scalar(
            "SELECT count(*) FROM executions WHERE workflow_id = %s AND status NOT IN "
            "('succeeded', 'failed', 'cancelled', 'needs_attention')",
            (workflow_id,),
        )
        if live == 0:
            return polls
        if session.worker is None or not session.worker.alive():
            raise BenchError("bin/worker died during the run")
        if time.monotonic() > deadline:
            raise BenchError(f"{live} executions still live after {timeout_s}s")
        time.sleep(0.05)


def _summary(session: Session, workflow_id: int) -> dict[str, Any]:
    row = session.conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE status <> 'succeeded'), "
        "extract(epoch FROM max(finished_at) - min(created_at)) "
        "FROM executions WHERE workflow_id = %s",
        (workflow_id,),
    ).fetchone()
    return {"count": row[0], "failed": row[1], "span_s": float(row[2] or 0.0)}


def executions(
    session: Session, key: str, count: int, connections: int, measure_commits: bool = True
) -> ExecutionRun:
    """About `count` executions sent as fast as the API takes them, worker running.

    Measured together: throughput from database timestamps, CPU of the whole machine
    from /proc, the worker's peak RSS, write transactions from the xid counter and —
    with measure_commits, which costs up to twice STATS_FLUSH_S of waiting —
    pg_stat_database.xact_commit.
    """
    worker = session.worker
    if worker is None:
        raise BenchError("executions need a running worker")
    workflow = session.workflows[key]
    session.reset()
    if measure_commits:
        if session.stats_dirty:
            time.sleep(STATS_FLUSH_S)  # what earlier phases did must not land in this window
        session.flush_own_stats()
    commits_before = session.xact_commits()
    xid_before = session.next_xid()
    sessions = {"api": session.api.pid, "worker": worker.pid}
    url = session.hook_url(key)
    polls = 0

    def sent() -> int:
        nonlocal polls
        polls += 1
        return session.scalar(
            "SELECT count(*) FROM executions WHERE workflow_id = %s", (workflow.workflow_id,)
        )

    name = f"{key}-{uuid.uuid4().hex[:4]}"
    session.stats_dirty = True
    with (
        session.sample_rss(worker.pid) as rss,
        session.py_spy(f"worker-{name}", worker.pid),
        session.py_spy(f"api-{name}", session.api.pid, subprocesses=True),
        session.statements(name),
        CpuWindow(sessions) as cpu,
    ):
        wrk_count(url, connections, count, f"{key}-{uuid.uuid4().hex[:6]}", sent)
        # Requests left in gunicorn's backlog when wrk stopped still become executions.
        polls += session.settle(outbox=False)
        polls += _wait_finished(session, workflow.workflow_id, timeout_s=600)
    write_tx = session.next_xid() - xid_before  # our polls are read-only: no xid
    commits = float("nan")
    if measure_commits:
        time.sleep(STATS_FLUSH_S)
        session.flush_own_stats()
        # Our own queries are commits too, but not FlowForge's: the reading before, the
        # polls, the xid reading and the flush request.
        commits = session.xact_commits() - commits_before - polls - 3
        session.stats_dirty = False
    summary = _summary(session, workflow.workflow_id)
    done = summary["count"]
    if done == 0 or summary["span_s"] <= 0:
        raise BenchError(f"no {key} execution finished")
    return ExecutionRun(
        per_s=done / summary["span_s"],
        executions=done,
        failed=summary["failed"],
        commits_per_execution=commits / done,
        write_tx_per_execution=write_tx / done,
        cpu_ms_per_execution=cpu.total_ms / done,
        cpu_ms_by_part={part: ms / done for part, ms in cpu.groups.items()},
        worker_rss_peak_mb=rss.peak_mb,
        seconds=summary["span_s"],
    )


def latency(session: Session, rate: float, duration_s: float) -> dict[str, float]:
    """Open-loop chain3 webhooks at `rate`; created_at -> finished_at percentiles."""
    workflow = session.workflows["chain3"]
    session.reset()
    session.stats_dirty = True
    sent = open_loop(session.hook_url("chain3"), rate, duration_s, f"lat-{uuid.uuid4().hex[:6]}")
    _wait_finished(session, workflow.workflow_id, timeout_s=300)
    row = session.conn.execute(
        """
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.99)
               WITHIN GROUP (ORDER BY d), max(d), count(*),
               count(*) FILTER (WHERE status <> 'succeeded')
        FROM (SELECT status, extract(epoch FROM finished_at - created_at) * 1000 AS d
              FROM executions WHERE workflow_id = %s) AS x
        """,
        (workflow.workflow_id,),
    ).fetchone()
    if not row[3]:
        raise BenchError("no latency sample finished")
    return {
        "p50": float(row[0]),
        "p99": float(row[1]),
        "max": float(row[2]),
        "executions": int(row[3]),
        "failed": int(row[4]),
        "rate_planned": sent.planned_rate,
        "rate_achieved": sent.achieved_rate,
        "generator_late_ms_p99": sent.late_ms_p99,
        "rejected": sent.sent - sent.accepted,
    }


class Stub:
    """The fan workflow's GET target on 127.0.0.1: a fixed small JSON answer."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = b'{"id": "A-1001", "price": 12.5, "currency": "EUR"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
