"""The four worker services driven in-process, one pass at a time, against the real
database and RabbitMQ (dramatiq's `stub_worker`/`rabbitmq_worker` idea): the executor's
`handle`, the relay's pass, the reaper's `reap`, the timer scanner's `scan`. Each test
takes seconds; the subprocess tests keep the promises that need real processes and
signals (crashes, SIGTERM drains, frozen workers).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import psycopg
import psycopg_pool
import pytest

from flowforge.store.db import conninfo, create_pool
from flowforge.store.priorities import SPREAD_EVERY_S
from flowforge.worker.broker import Topology, Wakeup
from flowforge.worker.executor import Executor
from flowforge.worker.reaper import Reaper
from flowforge.worker.relay import Relay
from flowforge.worker.timers import TimerScanner
from tests.support.definitions import CALLS, http, transform, workflow
from tests.support.inprocess import loopback_executor

CHAIN = workflow(
    transform("a", {"n": "{{ input.n }}"}),
    transform("b", {"m": "{{ a.n }}"}, after=("a",)),
    http("c", "POST", "http://127.0.0.1:9/c", after=("b",)),
    name="chain",
)
# The worker's claim as it commits it, its lease already expired: the worker died.
CLAIMED_AND_DIED = """
WITH s AS (
    UPDATE steps SET status = 'running', fencing_token = 1, attempts = 1, lease_owner = 'dead',
                     started_at = now(), lease_expires_at = now() - interval '1 minute'
    WHERE execution_id = %(id)s AND step_id = %(step)s
)
INSERT INTO attempts (execution_id, step_id, attempt, fencing_token, worker)
VALUES (%(id)s, %(step)s, 1, 1, 'dead')
"""
STEPS = "SELECT step_id, status, output, fencing_token FROM steps WHERE execution_id = %s"


@dataclass
class InProcessWorker:
    """The parts bin/worker runs in threads, built here to be driven one pass at a time."""

    pool: psycopg_pool.ConnectionPool
    executor: Executor
    relay: Relay
    reaper: Reaper
    timers: TimerScanner
    topology: Topology


@pytest.fixture
def worker(database_url: str, amqp_url: str, amqp_prefix: str) -> Iterator[InProcessWorker]:
    pool = create_pool(database_url, max_size=4, name="test-components")
    pool.open(wait=True, timeout=10)
    stop = threading.Event()
    topology = Topology(amqp_prefix)
    parts = InProcessWorker(
        pool=pool,
        executor=loopback_executor(pool, "in-process", lease_s=2.0),
        relay=Relay(pool, conninfo(database_url), amqp_url, topology, stop),
        reaper=Reaper(pool, lease_s=2.0, reconcile_s=2.0, stop=stop),
        timers=TimerScanner(pool, stop),
        topology=topology,
    )
    yield parts
    parts.relay.close()
    pool.close()


def publish(app_client: Any, api_key: str, definition: dict) -> None:
    r = app_client.post(
        f"/api/v1/workflows/{definition['name']}/versions",
        json=definition,
        headers={"Authorization": f"Bearer {api_key}"},
    )
    assert r.status_code == 201, r.get_data(as_text=True)


def start(app_client: Any, name: str, body: dict) -> str:
    r = app_client.post(f"/hooks/{name}", json=body)
    assert r.status_code == 202, r.get_data(as_text=True)
    return str(r.get_json()["execution_id"])


def steps(db: psycopg.Connection, eid: str) -> dict[str, tuple[Any, ...]]:
    return {row[0]: row[1:] for row in db.execute(STEPS, (eid,))}


def status(db: psycopg.Connection, eid: str) -> str:
    row = db.execute("SELECT status FROM executions WHERE id = %s", (eid,)).fetchone()
    assert row is not None
    return str(row[0])


def outbox(db: psycopg.Connection, eid: str) -> list[str]:
    rows = db.execute("SELECT step_id FROM outbox WHERE execution_id = %s ORDER BY id", (eid,))
    return [str(step_id) for (step_id,) in rows]


def test_handling_a_transform_chain_checkpoints_it_and_wakes_the_request_after_it(
    worker: InProcessWorker, app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    publish(app_client, api_key, CHAIN)
    eid = start(app_client, "chain", {"n": 7})
    assert outbox(db, eid) == ["a"]

    worker.executor.handle(Wakeup(eid, "a"))

    # Pure steps run on in the claiming transaction; the request waits for its wake-up.
    now = steps(db, eid)
    assert now["a"][:2] == ("succeeded", {"n": 7})
    assert now["b"][:2] == ("succeeded", {"m": 7})
    assert now["c"] == ("ready", None, 0)
    assert outbox(db, eid) == ["a", "c"]  # the relay has not published yet
    assert status(db, eid) == "running"


def test_a_duplicate_stale_or_unknown_wake_up_changes_nothing(
    worker: InProcessWorker, app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    publish(app_client, api_key, CHAIN)
    eid = start(app_client, "chain", {"n": 1})
    worker.executor.handle(Wakeup(eid, "a"))
    before = (
        steps(db, eid),
        outbox(db, eid),
        db.execute(
            "SELECT count(*) FROM execution_events WHERE execution_id = %s", (eid,)
        ).fetchone(),
    )

    worker.executor.handle(Wakeup(eid, "a"))  # duplicate: a succeeded already
    worker.executor.handle(Wakeup(eid, "nope"))  # a step the execution does not have
    worker.executor.handle(Wakeup(str(uuid.uuid4()), "a"))  # an execution that does not exist

    after = (
        steps(db, eid),
        outbox(db, eid),
        db.execute(
            "SELECT count(*) FROM execution_events WHERE execution_id = %s", (eid,)
        ).fetchone(),
    )
    assert after == before


def test_a_relay_pass_publishes_every_outbox_row_then_deletes_it(
    worker: InProcessWorker, app_client: Any, api_key: str, db: psycopg.Connection, amqp_url: str
) -> None:
    publish(app_client, api_key, CALLS)
    eids = [start(app_client, "calls", {}) for _ in range(3)]
    assert db.execute("SELECT count(*) FROM outbox").fetchone() == (6,)

    worker.relay.step()

    assert db.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
    assert worker.relay.published == 6
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        received = []
        while (message := channel.basic_get(worker.topology.queue, auto_ack=True))[0]:
            received.append(Wakeup.decode(message[2]))
    finally:
        conn.close()
    assert sorted((w.execution_id, w.step_id) for w in received) == sorted(
        (eid, sid) for eid in eids for sid in ("fetch", "charge")
    )


def test_reaping_an_expired_lease_repeats_a_safe_step_and_marks_an_unsafe_one_unknown(
    worker: InProcessWorker, app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    publish(app_client, api_key, CALLS)
    eid = start(app_client, "calls", {})
    for sid in ("fetch", "charge"):
        db.execute(CLAIMED_AND_DIED, {"id": eid, "step": sid})

    assert worker.reaper.reap() == 2

    now = steps(db, eid)
    assert now["fetch"][0] == "waiting"  # a GET is safe to repeat: retried after back-off
    assert now["charge"][0] == "unknown"  # a POST may have been sent: an operator decides
    assert db.execute(
        "SELECT step_id, outcome FROM attempts WHERE execution_id = %s ORDER BY step_id", (eid,)
    ).fetchall() == [("charge", "unknown"), ("fetch", "lost_lease")]
    assert worker.reaper.reap() == 0  # nothing left to recover


def test_a_scan_turns_due_waiting_steps_ready_with_their_wake_ups(
    worker: InProcessWorker, app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    publish(app_client, api_key, CALLS)
    due, later = start(app_client, "calls", {}), start(app_client, "calls", {})
    db.execute("DELETE FROM outbox")
    db.execute(
        "UPDATE steps SET status = 'waiting', wake_at = CASE WHEN execution_id = %s "
        "THEN now() - interval '1 second' ELSE now() + interval '1 hour' END",
        (due,),
    )
    db.execute("UPDATE executions SET status = 'waiting'")

    woken, pause = worker.timers.scan()

    assert woken == 2
    assert 0 < pause <= 1.0
    assert {s[0] for s in steps(db, due).values()} == {"ready"}
    assert status(db, due) == "running"
    assert sorted(outbox(db, due)) == ["charge", "fetch"]
    assert {s[0] for s in steps(db, later).values()} == {"waiting"}
    assert outbox(db, later) == []
    assert worker.timers.scan()[0] == 0


def test_a_batch_the_broker_cannot_route_stays_in_the_outbox_until_it_can(
    worker: InProcessWorker, app_client: Any, api_key: str, db: psycopg.Connection, amqp_url: str
) -> None:
    publish(app_client, api_key, CALLS)
    worker.relay.step()  # connected and declared, nothing to publish yet
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        conn.channel().queue_delete(worker.topology.queue)  # no queue: nothing routable
        eid = start(app_client, "calls", {})

        assert worker.relay.publish_batch() == 2  # claimed, returned, kept
        assert sorted(outbox(db, eid)) == ["charge", "fetch"]
        assert worker.relay.published == 0

        assert worker.relay.publish_batch() == 2  # the queue is declared again: delivered
        assert outbox(db, eid) == []
        assert worker.relay.published == 2
        assert (
            conn.channel().queue_declare(worker.topology.queue, passive=True).method.message_count
            == 2
        )
    finally:
        conn.close()


def test_the_relay_runs_a_lone_pure_wakeup_in_the_transaction_that_deletes_its_row(
    worker: InProcessWorker,
    app_client: Any,
    api_key: str,
    db: psycopg.Connection,
    database_url: str,
    amqp_url: str,
) -> None:
    publish(app_client, api_key, CHAIN)
    crashed = threading.Event()

    def crash_before_commit(conn: psycopg.Connection, wakeup: Wakeup) -> None:
        """The step's whole run, then a death before the relay's commit."""
        worker.executor.run_pure(conn, wakeup)
        crashed.set()
        raise RuntimeError("died before the commit")

    relay = Relay(
        worker.pool,
        conninfo(database_url),
        amqp_url,
        worker.topology,
        threading.Event(),
        run_pure=crash_before_commit,
    )
    try:
        relay.step()  # connected and declared, nothing to publish yet
        eid = start(app_client, "chain", {"n": 7})
        with pytest.raises(RuntimeError):
            relay.publish_batch()
        assert crashed.is_set()
        # Rolled back with the delete: the row is still there, nothing ran.
        assert outbox(db, eid) == ["a"]
        assert {k: s[0] for k, s in steps(db, eid).items()} == {
            "a": "ready",
            "b": "pending",
            "c": "pending",
        }
        assert relay.publish_batch() == 1  # the failed one goes through the broker instead
        assert (relay.published, relay.ran_inline) == (1, 0)

        relay.run_pure = worker.executor.run_pure
        again = start(app_client, "chain", {"n": 8})
        assert relay.publish_batch() == 1
        assert (relay.published, relay.ran_inline) == (1, 1)
        # a and b ran and c is ready, its wake-up in the outbox: no message for a.
        assert outbox(db, again) == ["c"]
        assert {k: s[0] for k, s in steps(db, again).items()} == {
            "a": "succeeded",
            "b": "succeeded",
            "c": "ready",
        }
        assert relay.publish_batch() == 1  # c is an http_request: published
        assert (relay.published, relay.ran_inline) == (2, 1)
        with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
            queue = conn.channel().queue_declare(worker.topology.queue, passive=True)
            assert queue.method.message_count == 2
    finally:
        relay.close()


def test_while_the_relay_waits_on_the_broker_its_claim_is_idle_in_transaction(
    worker: InProcessWorker, app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    """Not `active`: only a session idle in its transaction is bounded by the server's
    idle_in_transaction_session_timeout, which frees the claimed rows for another relay
    when the broker never answers."""
    publish(app_client, api_key, CALLS)
    worker.relay.step()  # connected and declared, nothing to publish yet
    start(app_client, "calls", {})
    channel = worker.relay._channel
    publish_one = channel.basic_publish
    seen: list[tuple[str, str]] = []

    def observed(*args: Any, **kwargs: Any) -> None:
        seen.extend(
            db.execute(
                "SELECT state, left(ltrim(query, E' \\n'), 13) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND ltrim(query, E' \\n') LIKE 'WITH taken AS%%'"
            ).fetchall()
        )
        publish_one(*args, **kwargs)

    channel.basic_publish = observed
    assert worker.relay.publish_batch() == 2
    assert seen and {state for state, _ in seen} == {"idle in transaction"}, seen


PURE3 = workflow(
    transform("a", {"n": "{{ input.n }}"}),
    transform("b", {"m": "{{ a.n }}"}, after=("a",)),
    transform("c", {"k": "{{ b.m }}"}, after=("b",)),
    name="pure3",
)


def test_the_relay_sends_a_notify_only_after_a_run_that_left_a_wake_up(
    worker: InProcessWorker,
    app_client: Any,
    api_key: str,
    db: psycopg.Connection,
    database_url: str,
    amqp_url: str,
    tmp_path: Any,
) -> None:
    """Issue 41: a chain of pure steps the relay runs to its end wrote no wake-up, so no
    NOTIFY_IF_PENDING follows its commit (a transaction, a commit, less per execution);
    a run that dispatched a step still wakes the relays after its commit."""
    publish(app_client, api_key, PURE3)
    publish(app_client, api_key, CHAIN)
    traced = create_pool(database_url, max_size=1, name="test-relay-traced")
    traced.open(wait=True, timeout=10)
    relay = Relay(
        traced,
        conninfo(database_url),
        amqp_url,
        worker.topology,
        threading.Event(),
        run_pure=worker.executor.run_pure,
    )
    trace = tmp_path / "trace"

    def sent_by_relay() -> str:
        """What the relay's one connection sends during one pass (libpq's trace)."""
        with open(trace, "w") as out:
            with traced.connection() as conn:
                conn.pgconn.trace(out.fileno())
            try:
                assert relay.publish_batch() == 1
            finally:
                with traced.connection() as conn:
                    conn.pgconn.untrace()
        return "\n".join(line for line in trace.read_text().splitlines() if "\tF\t" in line)

    try:
        relay.step()  # connected and declared, nothing to publish yet
        plain = start(app_client, "pure3", {"n": 1})
        sent = sent_by_relay()
        assert status(db, plain) == "succeeded"
        assert "pg_notify" not in sent, sent
        dispatching = start(app_client, "chain", {"n": 2})
        sent = sent_by_relay()
        assert {k: s[0] for k, s in steps(db, dispatching).items()}["c"] == "ready"
        assert "pg_notify" in sent
        assert relay.ran_inline == 2
    finally:
        relay.close()
        traced.close()


def test_an_executor_takes_up_a_pure_wakeup_in_two_round_trips(
    app_client: Any, api_key: str, db: psycopg.Connection, database_url: str, tmp_path: Any
) -> None:
    """Issue 41: the ready steps' priority spread travels with the unit of work's reads
    (no round trip or transaction of its own), and the chain's end sends no NOTIFY: the
    reads, then the writes with COMMIT."""
    publish(app_client, api_key, PURE3)
    eid = start(app_client, "pure3", {"n": 3})
    traced = create_pool(database_url, max_size=1, name="test-executor-traced")
    traced.open(wait=True, timeout=10)
    executor = loopback_executor(traced, "traced", lease_s=2.0)
    trace = tmp_path / "trace"
    try:
        # A first wake-up sees the spread (none: one priority); the next one past
        # SPREAD_EVERY_S asks again.
        executor.handle(Wakeup(start(app_client, "pure3", {"n": 2}), "a"))
        time.sleep(SPREAD_EVERY_S * 1.5)
        with open(trace, "w") as out:
            with traced.connection() as conn:
                conn.pgconn.trace(out.fileno())
            try:
                executor.handle(Wakeup(eid, "a"))
            finally:
                with traced.connection() as conn:
                    conn.pgconn.untrace()
    finally:
        traced.close()
    lines = trace.read_text().splitlines()
    directions = "".join(line.split("\t")[1] for line in lines if line.count("\t") >= 2)
    assert len(re.findall("F+", directions)) == 2, "\n".join(lines)
    assert any("min(priority)" in line for line in lines)
    assert not any("pg_notify" in line for line in lines)
    assert status(db, eid) == "succeeded"
