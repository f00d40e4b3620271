"""One bad execution never stops recovery of the others (docs/contract.md#storable-values).

Driven in-process against the real database (as dramatiq's tests drive their workers): a
real Reaper thread, rows written the way the worker and intake leave them, and a few
written the way no correct code path can — an instant beyond Python's datetime stored by
an older release, a step the definition does not know — to stand for "a bad execution".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool
import pytest

from flowforge.steps import netguard
from flowforge.worker.broker import Wakeup
from flowforge.worker.executor import Executor
from flowforge.worker.housekeeping import HOUSEKEEPING_SECONDS, Housekeeping
from flowforge.worker.reaper import Reaper
from flowforge.worker.recovery import MAX_RECOVERY_FAILURES, LeaseRecovery
from tests.support import inprocess
from tests.support.definitions import http, workflow
from tests.support.processes import wait_for

PAY = workflow(
    http("charge", "POST", "http://127.0.0.1:9/charge"),
    {"id": "sleep", "type": "delay", "until": "{{ input.at }}"},
    name="pay",
)
# The worker's claim, as it commits it: running, an open attempt, a lease — here already
# expired, as when the worker died. `order` keeps the bad ones first in the reaper's queue.
CLAIMED_AND_DIED = """
WITH s AS (
    UPDATE steps SET status = 'running', fencing_token = 1, attempts = 1, lease_owner = 'dead',
                     started_at = now(),
                     lease_expires_at = now() - make_interval(secs => 60 - %(order)s)
    WHERE execution_id = %(id)s AND step_id = 'charge'
)
INSERT INTO attempts (execution_id, step_id, attempt, fencing_token, worker)
VALUES (%(id)s, 'charge', 1, 1, 'dead')
"""


@pytest.fixture
def pool(database_url: str) -> Iterator[psycopg_pool.ConnectionPool]:
    with inprocess.pool(database_url, "test-reaper", max_size=4) as made:
        yield made


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def start(app_client: Any, at: str) -> str:
    r = app_client.post("/hooks/pay", json={"at": at})
    assert r.status_code == 202, r.get_data(as_text=True)
    return str(r.get_json()["execution_id"])


def charge_status(db: psycopg.Connection, eid: str) -> str:
    row = db.execute(
        "SELECT status FROM steps WHERE execution_id = %s AND step_id = 'charge'", (eid,)
    ).fetchone()
    assert row is not None
    return str(row[0])


def test_a_poisoned_execution_neither_stops_the_reaper_nor_answers_500(
    app_client: Any,
    api_key: str,
    db: psycopg.Connection,
    pool: psycopg_pool.ConnectionPool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = app_client.post("/api/v1/workflows/pay/versions", json=PAY, headers=auth(api_key))
    assert r.status_code == 201, r.get_data(as_text=True)
    poisoned, ghostly, good = (start(app_client, "2030-01-01T00:00:00Z") for _ in range(3))
    for order, eid in enumerate((poisoned, ghostly, good)):
        db.execute(CLAIMED_AND_DIED, {"id": eid, "order": order})
    # Stored before delays were checked: PostgreSQL holds the year 10000, Python cannot.
    db.execute(
        "UPDATE steps SET status = 'waiting', wake_at = '10000-01-01T00:00:00Z' "
        "WHERE execution_id = %s AND step_id = 'sleep'",
        (poisoned,),
    )
    # A running step its definition does not know: recovering it is a bug, not an outage.
    db.execute(
        "INSERT INTO steps (execution_id, step_id, type, position, status, fencing_token, "
        "lease_owner, lease_expires_at) VALUES (%s, 'ghost', 'http_request', 9, 'running', 1, "
        "'dead', now() - interval '2 minutes')",
        (ghostly,),
    )
    # A ready step whose wake-up was lost.
    db.execute("DELETE FROM outbox")
    db.execute("UPDATE steps SET ready_at = now() - interval '1 minute' WHERE status = 'ready'")

    stop = threading.Event()
    reaper = Reaper(pool, lease_s=2.0, reconcile_s=2.0, stop=stop)
    with caplog.at_level(logging.WARNING, logger="flowforge.worker.reaper"):
        reaper.start()
        try:
            wait_for(lambda: charge_status(db, good) == "unknown", timeout=15, message="reaped")
            wait_for(
                lambda: db.execute("SELECT count(*) FROM outbox").fetchone()[0] > 0,
                timeout=15,
                message="lost wake-ups re-dispatched",
            )
        finally:
            stop.set()
            reaper.join(timeout=10)

    assert charge_status(db, poisoned) == "unknown"  # readable again, and recovered
    # The ghost is logged once and set aside, not retried (and logged) every pass.
    failures = [r for r in caplog.records if "recovery failed" in r.getMessage()]
    assert [r.step for r in failures] == ["ghost"]  # type: ignore[attr-defined]
    assert db.execute(
        "SELECT lease_expires_at > now() + interval '1 minute' FROM steps "
        "WHERE execution_id = %s AND step_id = 'ghost'",
        (ghostly,),
    ).fetchone() == (True,)

    # The operator can still read and cancel the poisoned execution.
    shown = app_client.get(f"/api/v1/executions/{poisoned}", headers=auth(api_key))
    assert shown.status_code == 200, shown.get_data(as_text=True)
    sleep = next(s for s in shown.get_json()["steps"] if s["id"] == "sleep")
    assert sleep["wake_at"].startswith("9999-12-31")
    cancelled = app_client.post(f"/api/v1/executions/{poisoned}/cancel", headers=auth(api_key))
    assert cancelled.status_code in {200, 202}, cancelled.get_data(as_text=True)
    assert cancelled.get_json()["status"] == "cancelled"


GHOST = """
WITH s AS (
    INSERT INTO steps (execution_id, step_id, type, position, status, fencing_token, attempts,
                       lease_owner, started_at, lease_expires_at)
    VALUES (%(id)s, 'ghost', 'http_request', 9, 'running', 1, 1, 'dead', now(),
            now() - interval '2 minutes')
)
INSERT INTO attempts (execution_id, step_id, attempt, fencing_token, worker)
VALUES (%(id)s, 'ghost', 1, 1, 'dead')
"""


def test_a_step_whose_recovery_keeps_failing_is_settled_unknown_for_an_operator(
    app_client: Any, api_key: str, db: psycopg.Connection, pool: psycopg_pool.ConnectionPool
) -> None:
    """Set aside for ever, the step stayed running with no owner, out of sight of
    needs_attention, and its execution stayed running through a cancel."""
    r = app_client.post("/api/v1/workflows/pay/versions", json=PAY, headers=auth(api_key))
    assert r.status_code == 201, r.get_data(as_text=True)
    eid = start(app_client, "2030-01-01T00:00:00Z")
    db.execute(GHOST, {"id": eid})  # a running step whose recovery always fails
    recovery = LeaseRecovery(pool)
    for _ in range(MAX_RECOVERY_FAILURES):
        assert db.execute(
            "SELECT status FROM steps WHERE execution_id = %s AND step_id = 'ghost'", (eid,)
        ).fetchone() == ("running",)
        # The set-aside time has passed: the lease is expired again.
        db.execute(
            "UPDATE steps SET lease_expires_at = now() - interval '1 second' "
            "WHERE execution_id = %s AND step_id = 'ghost'",
            (eid,),
        )
        recovery.reap()

    status, error, owner, lease = db.execute(
        "SELECT status, error, lease_owner, lease_expires_at FROM steps "
        "WHERE execution_id = %s AND step_id = 'ghost'",
        (eid,),
    ).fetchone()
    assert (status, owner, lease) == ("unknown", None, None)
    assert f"recovery failed {MAX_RECOVERY_FAILURES} times" in error
    assert db.execute(
        "SELECT outcome, finished_at IS NOT NULL FROM attempts "
        "WHERE execution_id = %s AND step_id = 'ghost'",
        (eid,),
    ).fetchall() == [("unknown", True)]
    assert db.execute("SELECT status FROM executions WHERE id = %s", (eid,)).fetchone() == (
        "needs_attention",
    )
    kinds = [
        row[0]
        for row in db.execute(
            "SELECT kind FROM execution_events WHERE execution_id = %s AND "
            "(step_id = 'ghost' OR step_id IS NULL) ORDER BY id",
            (eid,),
        )
    ]
    assert kinds[-2:] == ["step.unknown", "execution.needs_attention"]
    # docs/contract.md#failure-groups: settled without the engine, still counted into its group.
    grouped = db.execute(
        "SELECT g.step_id, g.outcome, g.count FROM executions e "
        "JOIN failure_groups g ON g.id = e.failure_group_id WHERE e.id = %s",
        (eid,),
    ).fetchone()
    assert grouped == ("ghost", "unknown", 1)
    listed = app_client.get("/api/v1/executions?status=needs_attention", headers=auth(api_key))
    assert listed.status_code == 200, listed.get_data(as_text=True)
    assert eid in [e["id"] for e in listed.get_json()["items"]]
    assert recovery.reap() == 0  # nothing left to recover
    cancelled = app_client.post(f"/api/v1/executions/{eid}/cancel", headers=auth(api_key))
    assert cancelled.status_code in {200, 202}, cancelled.get_data(as_text=True)
    assert cancelled.get_json()["status"] == "cancelled"  # no longer running for ever


def lost_after(db: psycopg.Connection, reaper: Reaper, seconds: int) -> int:
    """Every ready step's wake-up went missing; `seconds` later the reconciler looks."""
    db.execute("DELETE FROM outbox")
    db.execute(
        "UPDATE steps SET ready_at = now() - make_interval(secs => %s) WHERE status = 'ready'",
        (seconds,),
    )
    return reaper.reconcile()


def test_a_wake_up_lost_again_and_again_is_re_dispatched_every_interval(
    app_client: Any, api_key: str, db: psycopg.Connection, pool: psycopg_pool.ConnectionPool
) -> None:
    # A broker that keeps losing wake-ups (blackholed, stranded, purged) never handled the
    # step: nothing failed, so nothing may slow the next re-dispatch down.
    r = app_client.post("/api/v1/workflows/pay/versions", json=PAY, headers=auth(api_key))
    assert r.status_code == 201, r.get_data(as_text=True)
    start(app_client, "2030-01-01T00:00:00Z")  # two ready roots: charge and sleep
    reaper = Reaper(pool, lease_s=2.0, reconcile_s=2.0, stop=threading.Event())
    for _ in range(5):
        assert lost_after(db, reaper, 3) == 2  # one interval (2 s) later, every time


def test_a_wake_up_that_keeps_failing_is_re_dispatched_ever_more_rarely(
    app_client: Any, api_key: str, db: psycopg.Connection, pool: psycopg_pool.ConnectionPool
) -> None:
    r = app_client.post("/api/v1/workflows/pay/versions", json=PAY, headers=auth(api_key))
    assert r.status_code == 201, r.get_data(as_text=True)
    eid = start(app_client, "2030-01-01T00:00:00Z")  # two ready roots: charge and sleep
    reaper = Reaper(pool, lease_s=2.0, reconcile_s=2.0, stop=threading.Event())
    executor = Executor(
        pool, worker_id="test", lease_s=2.0, allow=netguard.Allowlist(), secret_bindings={}
    )

    def both_dead_lettered() -> None:
        """Both re-dispatched wake-ups failed and were dead-lettered, as the consumer
        reports it."""
        for step in ("charge", "sleep"):
            executor.wakeup_failed(Wakeup(eid, step))

    assert lost_after(db, reaper, 3) == 2  # lost once: sent again after one interval (2 s)
    both_dead_lettered()
    assert lost_after(db, reaper, 3) == 0  # failed once: now it waits two intervals
    assert lost_after(db, reaper, 5) == 2
    both_dead_lettered()
    assert lost_after(db, reaper, 7) == 0  # failed twice: four
    assert lost_after(db, reaper, 9) == 2  # this one was lost, not failed:
    assert lost_after(db, reaper, 7) == 0  # the wait stays at four intervals
    assert lost_after(db, reaper, 9) == 2
    failed = db.execute("SELECT min(failed_wakeups) FROM steps WHERE status = 'ready'")
    assert failed.fetchone() == (2,)


OLD_KEYS = 35_000  # more than three batches
AGED_KEYS = """
INSERT INTO idempotency_keys (workflow_id, key, body_sha256, execution_id, created_at)
SELECT 1, %(prefix)s || n, '\\x00', gen_random_uuid(), now() - %(age)s::interval
FROM generate_series(1, %(n)s) AS n
"""


def test_housekeeping_forgets_every_expired_idempotency_key_in_one_pass(
    db: psycopg.Connection, pool: psycopg_pool.ConnectionPool
) -> None:
    db.execute(AGED_KEYS, {"prefix": "old-", "age": "25 hours", "n": OLD_KEYS})
    db.execute(AGED_KEYS, {"prefix": "young-", "age": "23 hours", "n": 100})
    housekeeping = Housekeeping(pool, threading.Event())
    started = time.monotonic()
    forgotten, caught_up = housekeeping.housekeep()
    elapsed = time.monotonic() - started
    assert db.execute(
        "SELECT count(*), count(*) FILTER (WHERE key LIKE 'young-%%') FROM idempotency_keys"
    ).fetchone() == (100, 100)
    assert (forgotten, caught_up) == (OLD_KEYS, True)
    print(f"forgot {forgotten} idempotency keys in {elapsed:.2f} s ({forgotten / elapsed:,.0f}/s)")
    assert housekeeping.step() == HOUSEKEEPING_SECONDS  # caught up: the next pass waits a minute
