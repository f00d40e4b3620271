"""Adversarial review of round 6 (notifications part two, live progress, search
attributes): one regression test per finding."""

from __future__ import annotations

import threading

import psycopg

from flowforge.store import notifications
from flowforge.store.db import conninfo, create_pool
from flowforge.worker.broker import Topology
from flowforge.worker.relay import Relay


def test_the_relay_wakes_the_notifier_whenever_it_starts_listening(
    database_url: str, amqp_url: str, amqp_prefix: str, db: psycopg.Connection
) -> None:
    """A NOTIFY sent while the relay has no LISTEN connection (before the worker's relay
    first connected, or while it reconnects) is lost: the notifier, asleep for IDLE_S,
    must then be woken by the (re)connection itself, or an endpoint enabled meanwhile is
    served up to a minute late."""
    woken = threading.Event()
    pool = create_pool(database_url, max_size=1, name="test-review-b")
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
