"""bin/api's sync workers wait for connections through epoll with EPOLLEXCLUSIVE
(serve.ProblemWorker.wait): a new connection wakes one idle worker, not all of them, and
busy workers never keep it from an idle one.

Wake-ups are read from /proc: each worker's main thread is the one that waits for
connections, and every wake-up from that wait is one voluntary context switch of it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from tests.support.processes import Process, start_api

WORKERS = 5
REQUESTS = 60


@pytest.fixture
def api(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[Process, str]]:
    process, base = start_api(env, tmp_path / "api.log", workers=WORKERS)
    yield process, base
    process.stop()


def workers_of(master: int) -> list[int]:
    """The gunicorn workers: the master's children (bin/api runs gunicorn in-process)."""
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children]


def voluntary_switches(pid: int) -> int:
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no context switches for {pid}")


def wait_for_workers(master: int) -> list[int]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pids = workers_of(master)
        if len(pids) == WORKERS:
            return pids
        time.sleep(0.1)
    raise AssertionError(f"gunicorn did not start {WORKERS} workers")


def test_a_connection_wakes_one_idle_worker_not_all_of_them(api: tuple[Process, str]) -> None:
    process, base = api
    pids = wait_for_workers(process.pid)
    for _ in range(WORKERS * 4):  # every worker has imported and answered once
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
    time.sleep(0.5)
    before = {pid: voluntary_switches(pid) for pid in pids}
    for _ in range(REQUESTS):
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
        time.sleep(0.005)  # every worker is back waiting before the next connection
    woken = sum(voluntary_switches(pid) - before[pid] for pid in pids)
    # Serving one request costs its worker a few switches of its own; with select(),
    # each connection also woke the other four, for at least WORKERS - 1 more
    # (measured here: 6.4 per request with select, 1.6 with EPOLLEXCLUSIVE).
    assert woken < REQUESTS * (WORKERS - 1), woken


def test_busy_workers_never_keep_a_connection_from_an_idle_one(
    api: tuple[Process, str],
) -> None:
    process, base = api
    wait_for_workers(process.pid)
    parts = urlsplit(base)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    slow = []
    try:
        # Four clients that send half a request and stall hold four of the five workers.
        for _ in range(WORKERS - 1):
            sock = socket.create_connection(address, timeout=10)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            slow.append(sock)
        time.sleep(0.5)
        for _ in range(10):
            started = time.monotonic()
            assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
            # Well under gunicorn's 15 s timeout, which is what would free a worker.
            assert time.monotonic() - started < 2.0
    finally:
        for sock in slow:
            sock.close()
