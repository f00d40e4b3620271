"""Issue 23 item 7: while the database is down, the API fails fast and the relay keeps its
broker connection.

Before: each request held a sync worker for the pool's 5 s checkout before its 503, so
webhooks piled up behind each other; the relay waited 15 s for a pooled connection (and
backed off) without servicing its AMQP connection, missed its heartbeats, was dropped by
the broker and reconnected once the database was back. Now a process that knows the
database is down waits FAIL_FAST_S for a connection, and the relay services the broker
while it waits. The server is the module's own (own_postgres), stopped for real.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import requests

from tests.faults.helpers import StartWorker, is_problem
from tests.support.api import Api
from tests.support.definitions import http, workflow
from tests.support.own_servers import OwnPostgres
from tests.support.processes import start_api, wait_for
from tests.support.target import Target

OUTAGE_S = 12.0  # longer than a few AMQP heartbeats (2 s with the tests' 2 s lease)
# A request once its process knows the database is down: FAIL_FAST_S plus the request's
# own cost on a loaded machine; the pool's checkout alone was 5 s.
FAST_BOUND_S = 2.0
RELAY_CONNECTED = "relay connected to broker"


@pytest.fixture
def database_url(own_postgres: OwnPostgres) -> Iterator[str]:
    with own_postgres.database() as url:
        yield url


def test_while_the_database_is_down_requests_fail_fast_and_the_relay_keeps_its_broker(
    env: dict[str, str],
    tmp_path: Path,
    api_key: str,
    db: psycopg.Connection,
    own_postgres: OwnPostgres,
    workers: StartWorker,
    target: Target,
) -> None:
    # One gunicorn worker: every request below meets the same process and its pool.
    api, base = start_api(env, tmp_path / "api.log", workers=1)
    try:
        client = Api(base, api_key)
        client.publish("outage", workflow(http("a", "GET", f"{target.url}/a")))
        worker = workers()
        wait_for(lambda: RELAY_CONNECTED in worker.log(), message="the relay's broker link")
        before = client.start("outage", {"n": 0})
        assert client.wait(before)["status"] == "succeeded"
        db.close()
        timings: list[float] = []
        with own_postgres.stopped("fast"):
            down_at = time.monotonic()
            while time.monotonic() - down_at < OUTAGE_S:
                asked = time.monotonic()
                r = requests.post(f"{base}/hooks/outage", json={"n": 1}, timeout=30)
                timings.append(time.monotonic() - asked)
                assert is_problem(r, 503), (r.status_code, r.text)
                assert r.headers.get("Retry-After")
                time.sleep(0.2)
        after = wait_for(
            lambda: (
                r.json()["execution_id"]
                if (
                    r := requests.post(f"{base}/hooks/outage", json={"n": 2}, timeout=30)
                ).status_code
                == 202
                else None
            ),
            timeout=60,
            message="intake back after the restart",
        )
        assert client.wait(after, timeout=60)["status"] == "succeeded"
        log = worker.log()
        api_log = api.log()
    finally:
        api.stop()
    # The first request learns of the outage (the pool's checkout); every later one fails
    # fast.
    assert len(timings) >= 5, timings
    slow = [round(t, 2) for t in timings[1:] if t > FAST_BOUND_S]
    assert not slow, f"503s after the first took {slow} s (all: {timings})"
    # The relay never lost its broker connection, and nobody logged a traceback.
    assert log.count(RELAY_CONNECTED) == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert "Traceback" not in api_log, api_log[-3000:]
    print(
        f"{len(timings)} requests during a {OUTAGE_S:.0f} s outage: first 503 in "
        f"{timings[0]:.2f} s, then max {max(timings[1:]):.2f} s; relay kept its broker link"
    )
