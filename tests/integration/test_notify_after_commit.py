"""The relay's NOTIFY travels after the commit that wrote wake-ups, not inside it
(issue 26): PostgreSQL serialises notifying commits on one database-wide lock held through
the WAL flush, which capped intake at one API process's worth."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool
import pytest

from flowforge.store import creation, flowcontrol, runs
from flowforge.store.db import conninfo
from flowforge.store.outbox import CHANNEL, LISTEN_OUTBOX
from flowforge.usecases import intake
from flowforge.usecases.ticks import Ticker
from flowforge.worker import reconciler, timers
from flowforge.worker.broker import Topology
from flowforge.worker.relay import Relay
from flowforge.worker.timers import TimerScanner
from tests.support import inprocess
from tests.support.definitions import http, workflow
from tests.support.processes import wait_for


def test_the_hot_statements_send_no_notify_themselves() -> None:
    for statement in (
        intake.CREATE_EXECUTION.as_string(),
        flowcontrol.GATED_INTAKE.as_string(),
        runs.SAVE_RUN,
    ):
        assert "pg_notify" not in statement


def _notified(listener: psycopg.Connection) -> list[str]:
    return [n.channel for n in listener.notifies(timeout=2, stop_after=1)]


def test_an_accepted_webhook_still_wakes_the_relay(database_url: str, open_client: Any) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(LISTEN_OUTBOX)
        r = open_client.post("/hooks/open", json={"n": 1})
        assert r.status_code == 202, r.get_data(as_text=True)
        assert _notified(listener) == [CHANNEL]


def test_a_unit_of_work_notifies_after_its_commit_only_while_wake_ups_wait(
    db: psycopg.Connection, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(LISTEN_OUTBOX)
        with runs.unit_of_work(db):
            db.execute("SELECT 1")
        assert list(listener.notifies(timeout=0.5)) == []  # the outbox is empty
        with runs.unit_of_work(db):
            db.execute("INSERT INTO outbox (execution_id, step_id) VALUES (gen_random_uuid(), 'x')")
        assert _notified(listener) == [CHANNEL]


def test_no_writer_of_wake_ups_notifies_inside_its_commit() -> None:
    """Timers, limit waits, slot hand-over, scheduled ticks and re-dispatches too (issue 26
    item 3): each notifies after its commit (db.notify_relay or a unit of work's
    NOTIFY_IF_PENDING)."""
    for statement in (
        timers.WAKE_DUE,
        timers.WAKE_LIMITED,
        flowcontrol.FILL_SLOTS,
        creation.BATCH_CREATE.as_string(),
        reconciler.REDISPATCH,
    ):
        assert "pg_notify" not in statement


def _publish(client: Any, definition: dict[str, Any]) -> None:
    r = client.post(f"/api/v1/workflows/{definition['name']}/versions", json=definition)
    assert r.status_code == 201, r.get_data(as_text=True)


def _http(name: str, **extra: Any) -> dict[str, Any]:
    return workflow(http("call", "GET", "http://127.0.0.1:9/"), name=name, **extra)


@pytest.fixture
def pool(database_url: str) -> Iterator[psycopg_pool.ConnectionPool]:
    with inprocess.pool(database_url, "test-notify") as made:
        yield made


def test_a_due_delay_a_freed_slot_and_a_tick_still_wake_the_relay(
    open_client: Any, db: psycopg.Connection, database_url: str, pool: Any
) -> None:
    _publish(open_client, _http("delayed"))
    _publish(open_client, _http("one-at-a-time", concurrency={"limit": 1}))
    _publish(
        open_client,
        {**_http("ticking"), "trigger": {"webhook": {"auth": "none"}, "schedule": {"every_s": 60}}},
    )
    assert open_client.post("/hooks/delayed", json={}).status_code == 202
    first = open_client.post("/hooks/one-at-a-time", json={}).get_json()["execution_id"]
    assert open_client.post("/hooks/one-at-a-time", json={}).status_code == 202
    db.execute("DELETE FROM outbox")
    db.execute(
        "UPDATE steps s SET status = 'waiting', wake_at = now() FROM executions e"
        " JOIN workflows w ON w.id = e.workflow_id"
        " WHERE e.id = s.execution_id AND w.key = 'delayed'"
    )
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(LISTEN_OUTBOX)
        # A due delay.
        assert TimerScanner(pool, threading.Event()).scan()[0] == 1
        assert _notified(listener) == [CHANNEL]
        # A slot freed without a unit of work to hand it on: the reconciler's fill.
        db.execute("UPDATE executions SET status = 'succeeded' WHERE id = %s", (first,))
        assert flowcontrol.fill_all(db) == 1
        assert _notified(listener) == [CHANNEL]
        # A scheduled tick.
        db.execute("UPDATE schedules SET next_tick_at = now(), fire_at = now()")
        outcomes = Ticker().decide_due(db)
        assert outcomes is not None and [o.outcome for o in outcomes] == ["fired"]
        assert _notified(listener) == [CHANNEL]
        assert db.execute("SELECT count(*) FROM outbox").fetchone() == (3,)


def test_a_lost_notify_is_covered_by_the_relays_poll(
    open_client: Any,
    db: psycopg.Connection,
    database_url: str,
    amqp_url: str,
    pool: Any,
    amqp_prefix: str,
) -> None:
    """A wake-up committed with no NOTIFY at all (the process died between its commit and
    the notification) is published by the relay's next poll, within POLL_SECONDS."""
    stop = threading.Event()
    relay = Relay(pool, conninfo(database_url), amqp_url, Topology(amqp_prefix), stop)
    relay.start()
    try:
        wait_for(lambda: relay._listener is not None, message="the relay listening")
        db.execute("INSERT INTO outbox (execution_id, step_id) VALUES (gen_random_uuid(), 'x')")
        wait_for(
            lambda: db.execute("SELECT count(*) FROM outbox").fetchone() == (0,),
            timeout=10,
            message="the relay's poll to publish the wake-up",
        )
        assert relay.published == 1
    finally:
        stop.set()
        relay.join(timeout=10)
