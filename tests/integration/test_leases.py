"""The lease set and its heartbeat in process, against the real database.

Promises (docs/contract.md#leases): the heartbeat renews a lease only while a holder is inside
`holding()` and only if the step still carries that holder's token *and* this worker's
name; a holder leaving drops its own entry, never another holder's of the same step;
a lease the heartbeat found taken, or not confirmed for half a lease, lets no request
leave — and a request kept back is provably never sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import psycopg
import psycopg_pool
import pytest
from prometheus_client import REGISTRY

from flowforge.steps import netguard
from flowforge.worker.broker import Wakeup
from flowforge.worker.executor import Executor
from flowforge.worker.leases import RENEW, SAFE_FRACTION, Heartbeat, Leases
from flowforge.worker.recovery import LeaseRecovery
from tests.support import inprocess
from tests.support.definitions import http, workflow
from tests.support.target import Target

LEASE_S = 60.0


@pytest.fixture
def pool(database_url: str) -> Iterator[psycopg_pool.ConnectionPool]:
    with inprocess.pool(database_url, "test-leases") as made:
        yield made


@pytest.fixture
def running_step(app_client: Any, api_key: str, db: psycopg.Connection) -> str:
    """An execution whose http_request step `fetch` is running, lease ending in 1 s."""
    headers = {"Authorization": f"Bearer {api_key}"}
    definition = workflow(http("fetch", "GET", "http://127.0.0.1:9/"), name="leases")
    assert (
        app_client.post(
            "/api/v1/workflows/leases/versions", json=definition, headers=headers
        ).status_code
        == 201
    )
    answer = app_client.post(
        "/hooks/leases", data=b"{}", headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 202
    return str(answer.get_json()["execution_id"])


def _run_as(db: psycopg.Connection, eid: str, owner: str, token: int) -> None:
    db.execute(
        "UPDATE steps SET status = 'running', fencing_token = %(token)s, lease_owner = %(owner)s,"
        " lease_expires_at = now() + interval '1 second'"
        " WHERE execution_id = %(eid)s AND step_id = 'fetch'",
        {"eid": eid, "owner": owner, "token": token},
    )


def _fetch_row(db: psycopg.Connection, eid: str, columns: str) -> tuple[Any, ...]:
    """These columns of the `fetch` step's row."""
    row = db.execute(
        f"SELECT {columns} FROM steps WHERE execution_id = %(eid)s AND step_id = 'fetch'",
        {"eid": eid},
    ).fetchone()
    assert row is not None
    return tuple(row)


def _seconds_left(db: psycopg.Connection, eid: str) -> float:
    return float(_fetch_row(db, eid, "extract(epoch FROM lease_expires_at - now())")[0])


def test_renewal_needs_our_name_too_not_just_the_token(
    pool: psycopg_pool.ConnectionPool, db: psycopg.Connection, running_step: str
) -> None:
    # Our claim with token 1 never committed; another worker claimed with the same number.
    _run_as(db, running_step, "worker-B", 1)
    leases = Leases(LEASE_S)
    lost_before = REGISTRY.get_sample_value("flowforge_leases_lost_total")
    with leases.holding(running_step, "fetch", 1, confirmed_at=time.monotonic()) as lease:
        Heartbeat(pool, leases, "worker-A", threading.Event()).beat()
        assert _seconds_left(db, running_step) < 2  # B's lease runs out as B left it
        assert lease.lost and not lease.still_ours()
    assert REGISTRY.get_sample_value("flowforge_leases_lost_total") == (lost_before or 0) + 1


def test_a_stale_holder_leaving_keeps_the_current_holders_lease(
    pool: psycopg_pool.ConnectionPool, db: psycopg.Connection, running_step: str
) -> None:
    _run_as(db, running_step, "worker-A", 2)
    leases = Leases(LEASE_S)
    heartbeat = Heartbeat(pool, leases, "worker-A", threading.Event())
    with ExitStack() as stale_scope:
        stale_scope.enter_context(leases.holding(running_step, "fetch", 1, time.monotonic()))
        with leases.holding(running_step, "fetch", 2, time.monotonic() - 100) as current:
            stale_scope.close()  # the thread with token 1 gives up its (lost) lease
            heartbeat.beat()
            assert _seconds_left(db, running_step) > LEASE_S - 5
            assert current.still_ours()  # the renewal confirmed it afresh
    assert leases.snapshot() == []


def test_a_lease_outside_holding_is_never_renewed(
    pool: psycopg_pool.ConnectionPool, db: psycopg.Connection, running_step: str
) -> None:
    _run_as(db, running_step, "worker-A", 1)
    leases = Leases(LEASE_S)
    with leases.holding(running_step, "fetch", 1, time.monotonic()):
        pass  # the work ended (or failed) without a checkpoint
    Heartbeat(pool, leases, "worker-A", threading.Event()).beat()
    assert _seconds_left(db, running_step) < 2


def test_a_lease_not_confirmed_for_half_its_length_is_not_ours_to_send_with() -> None:
    leases = Leases(2.0)
    now = time.monotonic()
    with leases.holding("e", "s", 1, confirmed_at=now - SAFE_FRACTION * 2.0 + 0.5) as fresh:
        assert fresh.still_ours()
    with leases.holding("e", "s", 1, confirmed_at=now - SAFE_FRACTION * 2.0) as stale:
        assert not stale.still_ours()


def test_a_request_kept_back_before_sending_never_reaches_the_server(target: Target) -> None:
    allow = netguard.Allowlist.parse("127.0.0.1")

    def refuse() -> None:
        raise netguard.NotSent("lease not confirmed in time")

    with pytest.raises(netguard.NotSent):
        netguard.send(
            "POST",
            f"{target.url}/charge",
            headers={},
            body=b"{}",
            timeout_s=5,
            allow=allow,
            before_send=refuse,
        )
    time.sleep(0.2)
    assert target.received == []


def _step_row(db: psycopg.Connection, eid: str) -> tuple[Any, ...]:
    return _fetch_row(db, eid, "status, lease_owner, lease_expires_at > now()")


def test_an_expired_lease_is_not_revived_by_a_late_beat(
    pool: psycopg_pool.ConnectionPool, db: psycopg.Connection, running_step: str
) -> None:
    """Lease recovery may already have read the step as expired: a late renewal that
    revived it would let the request leave while recovery takes the step back."""
    _run_as(db, running_step, "worker-A", 1)
    db.execute(
        "UPDATE steps SET lease_expires_at = now() - interval '1 second'"
        " WHERE execution_id = %(eid)s AND step_id = 'fetch'",
        {"eid": running_step},
    )
    leases = Leases(LEASE_S)
    with leases.holding(running_step, "fetch", 1, confirmed_at=time.monotonic()) as lease:
        Heartbeat(pool, leases, "worker-A", threading.Event()).beat()
        assert lease.lost and not lease.still_ours()
    assert _seconds_left(db, running_step) < 0


def test_recovery_racing_a_renewal_in_flight_leaves_the_live_lease_alone(
    pool: psycopg_pool.ConnectionPool,
    db: psycopg.Connection,
    database_url: str,
    running_step: str,
) -> None:
    """The beat's transaction began before the lease ran out (so it renews it), recovery's
    after (so it reads the step as expired) and reads it before the beat commits."""
    _run_as(db, running_step, "worker-A", 1)  # the lease ends in 1 s
    with psycopg.connect(database_url) as beat:
        beat.execute("SELECT now()")  # the beat's transaction, and its now(), begin here
        time.sleep(1.3)
        assert _seconds_left(db, running_step) < 0  # expired, as recovery sees it
        renewed = beat.execute(
            RENEW,
            {
                "lease_s": LEASE_S,
                "owner": "worker-A",
                "execution_ids": [running_step],
                "step_ids": ["fetch"],
                "tokens": [1],
            },
        ).fetchall()
        assert len(renewed) == 1  # renewed, not yet committed
        reaped = threading.Thread(target=LeaseRecovery(pool).reap)
        reaped.start()
        time.sleep(0.5)  # recovery has read the expired step and waits for its row
        beat.commit()
        reaped.join(timeout=10)
    assert not reaped.is_alive()
    assert _step_row(db, running_step) == ("running", "worker-A", True)


def test_a_checkpoint_committed_during_a_beat_is_not_reported_as_a_lost_lease(
    app_client: Any,
    api_key: str,
    pool: psycopg_pool.ConnectionPool,
    db: psycopg.Connection,
    target: Target,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The beat runs after the checkpoint committed but before the executor's thread left
    holding(): the step is no longer running, yet nobody took the lease over."""
    headers = {"Authorization": f"Bearer {api_key}"}
    definition = workflow(http("fetch", "GET", target.url), name="checkpoint")
    published = app_client.post(
        "/api/v1/workflows/checkpoint/versions", json=definition, headers=headers
    )
    assert published.status_code == 201, published.get_data(as_text=True)
    eid = app_client.post("/hooks/checkpoint", json={}).get_json()["execution_id"]
    executor = Executor(
        pool,
        worker_id="worker-A",
        lease_s=LEASE_S,
        allow=netguard.Allowlist.parse("127.0.0.1"),
        secret_bindings={},
    )
    heartbeat = Heartbeat(pool, executor.leases, "worker-A", threading.Event())
    beats: list[int] = []

    class BeatOnCheckpoint(logging.Handler):
        """Beats at the moment the executor logs the committed checkpoint."""

        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "step attempt recorded":
                beats.append(len(executor.leases.snapshot()))
                heartbeat.beat()

    executor_logger = logging.getLogger("flowforge.worker.executor")
    handler = BeatOnCheckpoint()
    executor_logger.addHandler(handler)
    previous = executor_logger.level
    executor_logger.setLevel(logging.INFO)
    try:
        with caplog.at_level(logging.WARNING, logger="flowforge.worker.leases"):
            executor.handle(Wakeup(eid, "fetch"))
    finally:
        executor_logger.removeHandler(handler)
        executor_logger.setLevel(previous)
    assert beats == [1]  # the beat ran while the lease was still in the set
    assert _step_row(db, eid)[0] == "succeeded"
    assert [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()] == []
