"""Load generators, both on 127.0.0.1 only.

- wrk (Debian's package) with webhook.lua for closed-loop throughput: every request a
  POST with a unique Idempotency-Key; a per-thread quota sends "about N" executions.
- An in-repo open-loop generator for latency: requests leave on a fixed schedule
  whether or not earlier ones were answered, like wrk2's constant-throughput mode, so a
  slow server cannot slow the arrivals down and hide its own queueing.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.bench.infra import BenchError, _die_with_parent, run_tool

LUA = Path(__file__).resolve().parent / "webhook.lua"
BODY = b'{"order_id": "A-1001", "total": 250, "customer": {"id": 42, "tier": "gold"}}'
WRK_THREADS = 2


def wrk_path() -> str:
    """wrk, or a BenchError that says how to get it."""
    found = shutil.which("wrk")
    if not found:
        raise BenchError("wrk not found: install it with `apt-get install -y wrk`")
    return found


@dataclass(frozen=True)
class WrkResult:
    """What webhook.lua's done() reports."""

    requests: int
    accepted: int
    duration_s: float
    errors: int
    latency_p50_ms: float
    latency_p99_ms: float

    @property
    def accepted_per_s(self) -> float:
        return self.accepted / self.duration_s if self.duration_s else 0.0


def _parse(stdout: str) -> WrkResult:
    for line in stdout.splitlines():
        if line.startswith("WRK_JSON "):
            data = json.loads(line[len("WRK_JSON ") :])
            return WrkResult(
                requests=data["requests"],
                accepted=data["accepted"],
                duration_s=data["duration_us"] / 1e6,
                errors=data["connect_errors"]
                + data["read_errors"]
                + data["write_errors"]
                + data["timeouts"],
                latency_p50_ms=data["latency_p50_us"] / 1000,
                latency_p99_ms=data["latency_p99_us"] / 1000,
            )
    raise BenchError(f"wrk printed no summary:\n{stdout[-2000:]}")


def _argv(url: str, connections: int, duration_s: float, prefix: str, quota: int) -> list[str]:
    return [
        wrk_path(),
        f"-t{WRK_THREADS}",
        f"-c{max(connections, WRK_THREADS)}",
        f"-d{max(1, math.ceil(duration_s))}s",
        "--timeout",
        "10s",
        "-s",
        str(LUA),
        url,
        "--",
        prefix,
        str(quota),
    ]


def wrk(url: str, connections: int, duration_s: float, prefix: str) -> WrkResult:
    """Closed-loop POSTs for duration_s."""
    done = run_tool(_argv(url, connections, duration_s, prefix, 0), timeout=duration_s + 60)
    if done.returncode != 0:
        raise BenchError(f"wrk failed ({done.returncode}): {done.stderr[-1000:]}")
    return _parse(done.stdout)


def wrk_count(
    url: str,
    connections: int,
    count: int,
    prefix: str,
    sent: Callable[[], int],
    timeout_s: float = 600.0,
) -> WrkResult:
    """About `count` POSTs as fast as the server takes them.

    wrk's main thread sleeps for the whole -d even after every thread met its quota,
    so we watch `sent()` (executions in the database) and interrupt it: wrk answers
    SIGINT by stopping its threads and printing the summary.
    """
    quota = math.ceil(count / WRK_THREADS)
    proc = subprocess.Popen(
        _argv(url, connections, timeout_s, prefix, quota),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_die_with_parent,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            if sent() >= count:
                break
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode not in (0, -signal.SIGINT):
        raise BenchError(f"wrk failed ({proc.returncode}): {stderr[-1000:]}")
    return _parse(stdout)


@dataclass(frozen=True)
class OpenLoopResult:
    """What the open-loop generator did: how many, at what rate, and what came back."""

    sent: int
    accepted: int
    planned_rate: float
    achieved_rate: float
    late_ms_p99: float  # how far behind schedule requests left (the generator's own lag)


def post_webhook(host: str, port: int, path: str, key: str) -> tuple[int, bytes]:
    """One webhook (BODY, Idempotency-Key `key`) on a new connection, as gunicorn's sync
    workers close each one anyway: its status and body."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(
            "POST",
            path,
            body=BODY,
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
        )
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def open_loop(url: str, rate: float, duration_s: float, prefix: str) -> OpenLoopResult:
    """POST at a constant `rate` for `duration_s`, never waiting for answers."""
    parts = urlsplit(url)
    host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path
    count = max(1, int(rate * duration_s))
    interval = 1.0 / rate
    lateness: list[float] = []

    def post(i: int) -> int:
        try:
            return post_webhook(host, port, path, f"{prefix}-{i}")[0]
        except OSError:
            return 0

    # Enough threads that a slow answer never delays the next departure.
    with ThreadPoolExecutor(max_workers=64, thread_name_prefix="openloop") as pool:
        futures = []
        start = time.monotonic() + 0.05
        for i in range(count):
            due = start + i * interval
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            lateness.append(max(0.0, time.monotonic() - due))
            futures.append(pool.submit(post, i))
        elapsed = time.monotonic() - start
        statuses = [f.result() for f in futures]
    lateness.sort()
    return OpenLoopResult(
        sent=count,
        accepted=sum(1 for s in statuses if s == 202),
        planned_rate=rate,
        achieved_rate=count / elapsed if elapsed > 0 else 0.0,
        late_ms_p99=lateness[min(len(lateness) - 1, int(len(lateness) * 0.99))] * 1000,
    )


def wait_http(url: str, alive: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Wait until `url` answers any HTTP status; fail early when the server died."""
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise BenchError(f"{what} exited during start-up")
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=1)
            try:
                conn.request("GET", parts.path or "/")
                conn.getresponse().read()
                return
            finally:
                conn.close()
        time.sleep(0.1)
    raise BenchError(f"{what} did not answer {url} within {timeout_s}s")


def describe() -> dict[str, Any]:
    """Which generators were used, for the JSON report."""
    return {
        "throughput": f"wrk ({WRK_THREADS} threads, tests/bench/webhook.lua: POST, "
        "unique Idempotency-Key per request)",
        "latency": "in-repo open-loop generator (tests/bench/load.py: constant rate, "
        "new connection per request)",
    }
