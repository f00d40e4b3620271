"""Where notifications, live progress and search attributes meet their edges: a wake-up
lost while the relay reconnects, a claim too short for an attempt, and a Slack URL that
must never reach the table in clear."""

from __future__ import annotations

import threading

import psycopg
import psycopg_pool
import pytest
from psycopg.types.json import Jsonb

from flowforge.steps import netguard
from flowforge.store import notifications
from flowforge.store.db import conninfo, create_pool
from flowforge.trust.sealing import parse_key
from flowforge.worker import notifier
from flowforge.worker.broker import Topology
from flowforge.worker.relay import Relay
from tests.support.processes import TEST_NOTIFY_KEY
from tests.support.target import Reply, Target

KEY = parse_key(TEST_NOTIFY_KEY)


def test_the_relay_wakes_the_notifier_whenever_it_starts_listening(
    database_url: str, amqp_url: str, amqp_prefix: str, db: psycopg.Connection
) -> None:
    """A NOTIFY sent while the relay has no LISTEN connection (before the worker's relay
    first connected, or while it reconnects) is lost: the notifier, asleep for IDLE_S,
    must then be woken by the (re)connection itself, or an endpoint enabled meanwhile is
    served up to a minute late."""
    woken = threading.Event()
    pool = create_pool(database_url, max_size=1, name="test-relay-wake")
    pool.open(wait=True, timeout=10)
    relay = Relay(
        pool,
        conninfo(database_url),
        amqp_url,
        Topology(amqp_prefix),
        threading.Event(),
        wake_notifier=woken.set,
    )
    try:
        relay._ensure_listener()
        assert woken.is_set()
        woken.clear()
        relay._close_listener()
        db.execute(notifications.WAKE)  # an endpoint enabled while the relay reconnects
        relay._ensure_listener()
        assert woken.is_set()
    finally:
        relay.close()
        pool.close()


def _one_pass(database_url: str, key: bytes | None) -> None:
    """One pass of a worker's notifier with this notify key, its sends waited for."""
    pool = psycopg_pool.ConnectionPool(
        database_url, min_size=1, open=True, kwargs={"autocommit": True}
    )
    stop = threading.Event()
    allow = netguard.Allowlist.parse("127.0.0.1")
    sender = notifier.Notifier(pool, stop, allow=allow, window_s=1, disable_after_s=60, key=key)
    try:
        sender.step()
        sender.senders.shutdown(wait=True)
    finally:
        stop.set()
        sender.close()
        pool.close()


def test_a_sender_never_starts_an_attempt_its_claim_cannot_cover(
    database_url: str, db: psycopg.Connection, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two due messages of one slow endpoint, claimed in one pass for CLAIM_S: the second
    must not be sent once the claim left cannot cover a whole attempt. Sent anyway, it is
    in flight when the claim ends, and another worker's notifier claims and sends it too
    (a duplicate, concurrent with the first)."""
    monkeypatch.setattr(notifier, "SEND_TIMEOUT_S", 2.0)
    monkeypatch.setattr(notifier, "CONNECT_TIMEOUT_S", 0.5)
    monkeypatch.setattr(notifier, "CLAIM_S", 3.0)
    target.script = lambda _r: Reply(json={"ok": True}, delay_s=1.0)
    made = notifications.create(
        db, name="slow", url=f"{target.url}/slow", shape="standard",
        kinds=["execution.failed"], workflow=None, key=KEY,
    )  # fmt: skip
    for n in range(2):
        db.execute(
            "INSERT INTO notify_deliveries (endpoint_id, payload, events) VALUES (%s, %s, 1)",
            (made["id"], Jsonb({"type": "test", "n": n, "data": {}})),
        )
    _one_pass(database_url, key=KEY)
    assert [r.json()["n"] for r in target.received] == [0]
    pending = "SELECT attempts FROM notify_deliveries WHERE status = 'pending'"
    assert db.execute(pending).fetchall() == [(1,)]  # claimed once, falls due at its end


def test_a_worker_without_the_notify_key_leaves_sealed_messages_to_one_with_it(
    database_url: str, db: psycopg.Connection, target: Target
) -> None:
    """A worker started without FLOWFORGE_NOTIFY_KEY cannot open a sealed endpoint's
    secret: it must not record that as the endpoint failing (enough of those disable a
    healthy endpoint); the message falls due again for a worker with the key."""
    made = notifications.create(
        db, name="keyed", url=f"{target.url}/keyed", shape="standard",
        kinds=["execution.failed"], workflow=None, key=KEY,
    )  # fmt: skip
    db.execute(
        "INSERT INTO notify_deliveries (endpoint_id, payload, events) VALUES (%s, %s, 1)",
        (made["id"], Jsonb({"type": "test", "data": {}})),
    )
    _one_pass(database_url, key=None)
    assert target.received == []
    endpoint = "SELECT failing_since, disabled_at FROM notify_endpoints WHERE id = %s"
    assert db.execute(endpoint, (made["id"],)).fetchone() == (None, None)
    message = "SELECT status, last_error FROM notify_deliveries WHERE endpoint_id = %s"
    assert db.execute(message, (made["id"],)).fetchone() == ("pending", None)


def test_a_slack_url_never_reaches_the_table_in_clear(db: psycopg.Connection) -> None:
    """The Slack URL is the secret (sql/0067): creating an endpoint must not write it in
    clear into any row version, or the table's files, base backups and WAL archives hold
    it (what seal_clear VACUUMs away for old rows)."""
    hook = "https://hooks.slack.com/services/T0/B0/xyzzy-secret-part"
    notifications.create(
        db, name="chat", url=hook, shape="slack", kinds=["execution.failed"], workflow=None,
        key=KEY,
    )  # fmt: skip
    db.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
    pages = "SELECT pg_relation_size('notify_endpoints') / current_setting('block_size')::int"
    (count,) = db.execute(pages).fetchone() or (0,)
    raw = b"".join(
        bytes(page)
        for n in range(count)
        for (page,) in db.execute("SELECT get_raw_page('notify_endpoints', %s)", (n,))
    )
    assert hook.encode() not in raw
