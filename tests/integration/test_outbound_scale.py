"""Outbound at scale (docs/contract.md#outbound): hundreds of slow requests in flight on a
few database connections, and kept-alive outbound connections — real bin/api and bin/worker."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg

from tests.support.api import Api
from tests.support.definitions import unsigned
from tests.support.processes import Process, wait_for
from tests.support.target import InFlight, Target
from tests.support.tls import make_test_ca

COUNT_POOLED = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'flowforge-worker'
"""
COUNT_SUCCEEDED = "SELECT count(*) FROM executions WHERE status = 'succeeded'"
COUNT_SERVICES = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'flowforge-worker-services'
"""


def tcp_connections(pid: int, port: int) -> int:
    """How many established TCP connections process `pid` has to `port`, from /proc: the
    worker's own sockets, whatever it names them."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = 0
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                established = fields[3] == "01"
                found += established and remote_port == port and fields[9] in inodes
    return found


def test_a_worker_with_concurrency_200_holds_no_more_than_its_pool_size_of_connections(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    count = 200
    slow = InFlight(hold_s=6.0)
    target.script = slow
    worker = workers(FLOWFORGE_WORKER_CONCURRENCY=str(count), FLOWFORGE_WORKER_POOL_SIZE="5")
    pg_port = int(db.info.port)
    client = Api(api, api_key)
    client.publish(
        "slow",
        unsigned(
            [
                {
                    "id": "call",
                    "type": "http_request",
                    "request": {"method": "GET", "url": f"{target.url}/slow"},
                }
            ]
        ),
    )
    with ThreadPoolExecutor(8) as starters:
        list(starters.map(lambda n: client.start("slow", {"n": n}), range(count)))
    most_pooled = most_connections = most_services = 0

    def all_succeeded() -> bool:
        nonlocal most_pooled, most_connections, most_services
        most_pooled = max(most_pooled, db.execute(COUNT_POOLED).fetchone()[0])
        most_services = max(most_services, db.execute(COUNT_SERVICES).fetchone()[0])
        most_connections = max(most_connections, tcp_connections(worker.pid, pg_port))
        return db.execute(COUNT_SUCCEEDED).fetchone()[0] == count

    wait_for(all_succeeded, timeout=120, interval=0.05, message="every execution to succeed")
    # Most of them were in flight together, yet the pool never grew past its size: the
    # worker's only other connection is the relay's LISTEN connection.
    assert slow.most >= 150, slow.most
    assert 2 <= most_connections <= 5 + 1, most_connections
    assert 1 <= most_pooled <= 5, most_pooled
    # The background services (relay, heartbeat...) have their share of the budget, so
    # they never queue behind 200 executor threads: no request was kept home for want
    # of a fresh liveness beat, and the executors' own pool is the rest of the budget.
    assert most_services == 1 and most_pooled <= 5 - 1, (most_services, most_pooled)
    assert "no longer knows its lease" not in worker.log()


def test_100_https_steps_to_one_target_open_at_most_2_connections(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    db: psycopg.Connection,
    tmp_path: Path,
) -> None:
    ca, context = make_test_ca(tmp_path)
    target = Target(tls=context)
    try:
        # The worker trusts the test CA the standard way, with its certificate checks on.
        workers(FLOWFORGE_WORKER_CONCURRENCY="2", SSL_CERT_FILE=str(ca))
        client = Api(api, api_key)
        client.publish(
            "kept",
            unsigned(
                [
                    {
                        "id": "call",
                        "type": "http_request",
                        "request": {"method": "POST", "url": f"{target.url}/kept", "json": {}},
                    }
                ]
            ),
        )
        for n in range(100):
            client.start("kept", {"n": n})
        wait_for(
            lambda: db.execute(COUNT_SUCCEEDED).fetchone()[0] == 100,
            timeout=90,
            message="every execution to succeed",
        )
        assert len(target.requests_to("/kept")) == 100
        assert target.connections <= 2, target.connections
    finally:
        target.close()
