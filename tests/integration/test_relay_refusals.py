"""Wake-ups the broker refuses stay in the outbox (issue 26's node-loss failure).

A quorum queue refuses a publish outright when it cannot take it: its channel's view
of the queue still names a leader on a node that is gone (what a relay reconnecting
right after the loss of that node gets, until the new leader is written down), or the
queue is full with `overflow: reject-publish`. RabbitMQ 3.10 then still answers an AMQP
transaction's tx.commit with commit-ok — the refusal is only kept in the channel — so a
relay that trusted commit-ok deleted the rows of wake-ups that were never queued, and
that channel lost every later one too. Publisher confirms say `nack` instead.

The full queue is the deterministic way to make a quorum queue refuse; it runs on a
RabbitMQ node of this module's own (a policy, which the shared broker must not get).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pika
import psycopg
import pytest

from flowforge.errors import BrokerUnavailable
from flowforge.store.db import conninfo, create_pool
from flowforge.worker.broker import Topology
from flowforge.worker.relay import Relay
from tests.support.definitions import CALLS
from tests.support.own_servers import OwnRabbitMQ

FULL = {"max-length": 0, "overflow": "reject-publish"}


@pytest.fixture
def relay(database_url: str, own_rabbitmq: OwnRabbitMQ, amqp_prefix: str) -> Iterator[Relay]:
    pool = create_pool(database_url, max_size=2, name="test-relay-refusals")
    pool.open(wait=True, timeout=10)
    made = Relay(
        pool, conninfo(database_url), own_rabbitmq.url, Topology(amqp_prefix), threading.Event()
    )
    yield made
    made.close()
    pool.close()


def outbox(db: psycopg.Connection, eid: str) -> list[str]:
    rows = db.execute("SELECT step_id FROM outbox WHERE execution_id = %s ORDER BY id", (eid,))
    return sorted(str(step_id) for (step_id,) in rows)


def depth(channel: Any, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def test_wakeups_a_quorum_queue_refuses_stay_in_the_outbox_until_it_takes_them(
    relay: Relay,
    own_rabbitmq: OwnRabbitMQ,
    app_client: Any,
    api_key: str,
    db: psycopg.Connection,
) -> None:
    queue = relay.topology.queue
    r = app_client.post(
        "/api/v1/workflows/calls/versions",
        json=CALLS,
        headers={"Authorization": f"Bearer {api_key}"},
    )
    assert r.status_code == 201, r.get_data(as_text=True)
    relay.step()  # connected and declared, nothing to publish yet
    policy = own_rabbitmq.ctl(
        "set_policy", "full", f"^{queue}$", json.dumps(FULL), "--apply-to", "queues"
    )
    assert policy.returncode == 0, policy.stderr
    conn = pika.BlockingConnection(pika.URLParameters(own_rabbitmq.url))
    try:
        channel = conn.channel()
        # One message takes a queue of max-length 0 past its limit: it refuses the next.
        channel.basic_publish("", queue, b"{}")
        r = app_client.post("/hooks/calls", json={})
        assert r.status_code == 202, r.get_data(as_text=True)
        eid = str(r.get_json()["execution_id"])

        with pytest.raises(BrokerUnavailable, match="refused"):
            relay.publish_batch()
        assert outbox(db, eid) == ["charge", "fetch"]
        assert relay.published == 0
        assert depth(channel, queue) == 1

        assert own_rabbitmq.ctl("clear_policy", "full").returncode == 0
        channel.queue_purge(queue)
        relay.on_failure(BrokerUnavailable("refused"))  # what the loop does after a failed pass
        relay.step()  # reconnects: the queue takes them now
        assert outbox(db, eid) == []
        assert relay.published == 2
        assert depth(channel, queue) == 2
    finally:
        conn.close()
