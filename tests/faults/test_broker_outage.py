"""Case 1: RabbitMQ is down when webhooks arrive.

Promise: every webhook still gets 202, because intake writes only to PostgreSQL (the
execution, its steps and an outbox row, in one transaction); the executions stay queued
with their outbox rows; once the broker is back the worker publishes and finishes them
all. Proved twice: with a fault proxy between the worker and the broker (cut and
blackhole), and with a real `rabbitmqctl stop_app` / `start_app` and a stop and start of
a whole node — a RabbitMQ node of the test's own (`own_rabbitmq`), never the shared one.
"""

from __future__ import annotations

import time

import pika
import psycopg
import pytest

from flowforge.errors import BrokerUnavailable
from flowforge.worker import broker
from tests.faults.helpers import StartWorker, logged, scalar, wait_logged
from tests.support.api import Api
from tests.support.definitions import http, workflow
from tests.support.faultproxy import FaultProxy
from tests.support.own_servers import OwnRabbitMQ
from tests.support.processes import Process, wait_for
from tests.support.target import Target

WEBHOOKS = 10
# Longer than the reconcile interval and the lease: if anything were going to move
# without the broker, it would have by then.
OBSERVE_S = 3.0


def _publish(client: Api, target: Target) -> None:
    client.publish(
        "orders",
        workflow(
            http("fetch", "GET", f"{target.url}/orders/{{{{ input.n }}}}"),
            http("notify", "POST", f"{target.url}/notify", after=("fetch",), json="{{ input }}"),
        ),
    )


def _accept_while_down(client: Api, db: psycopg.Connection, target: Target) -> list[str]:
    """Send webhooks during the outage; all are 202 and stay queued with outbox rows."""
    ids = [client.start("orders", {"n": n}) for n in range(WEBHOOKS)]
    time.sleep(OBSERVE_S)
    statuses = [client.execution(eid)["status"] for eid in ids]
    assert statuses == ["queued"] * WEBHOOKS
    waiting = scalar(
        db,
        "SELECT count(DISTINCT execution_id) FROM outbox WHERE execution_id = ANY(%(ids)s)",
        {"ids": ids},
    )
    assert waiting == WEBHOOKS
    assert target.received == []
    return ids


def _all_finish(client: Api, db: psycopg.Connection, target: Target, ids: list[str]) -> None:
    for eid in ids:
        assert client.wait(eid, timeout=60)["status"] == "succeeded"
    assert scalar(db, "SELECT count(*) FROM outbox") == 0
    assert len(target.requests_to("/orders/")) == WEBHOOKS
    assert len(target.requests_to("/notify")) == WEBHOOKS


@pytest.mark.parametrize("fault", [pytest.param("cut", marks=pytest.mark.slow), "blackhole"])
def test_proxy_outage_keeps_webhooks_and_finishes_them_after_restore(
    fault: str,
    client: Api,
    db: psycopg.Connection,
    workers: StartWorker,
    target: Target,
    broker_proxy: FaultProxy,
    amqp_url: str,
) -> None:
    _publish(client, target)
    worker: Process = workers(FLOWFORGE_AMQP_URL=broker_proxy.url(amqp_url))
    wait_for(lambda: logged(worker, "relay connected to broker"), message="relay connected")
    assert broker_proxy.open_links >= 2  # relay and consumer really go through the proxy

    getattr(broker_proxy, fault)()
    if fault == "cut":
        wait_logged(worker, "broker connection lost")
    ids = _accept_while_down(client, db, target)

    broker_proxy.restore()
    _all_finish(client, db, target, ids)


def test_a_reset_during_the_amqp_handshake_is_a_broker_outage_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the cut test above (about one run in ten): when the peer resets the socket
    between the TCP and the AMQP handshake, pika raises ValueError("Expected connected
    socket ..."), which used to escape the consumer's reconnect loop and end consumption
    for good while the process stayed up. The race is too narrow to force with real
    sockets, so pika's constructor is made to fail the way it did there."""

    def reset(_params: object) -> None:
        raise ValueError("Expected connected socket, but getpeername() failed: error=107")

    monkeypatch.setattr(pika, "BlockingConnection", reset)
    with pytest.raises(BrokerUnavailable):
        broker.connect("amqp://guest:guest@127.0.0.1:1/%2F", "test")


@pytest.mark.slow
@pytest.mark.parametrize("outage", ["stop_app", "node stop"])
def test_broker_outage_keeps_webhooks_and_finishes_them_after_start(
    outage: str,
    client: Api,
    db: psycopg.Connection,
    workers: StartWorker,
    target: Target,
    own_rabbitmq: OwnRabbitMQ,
) -> None:
    """The whole broker goes away (its app, or the node itself) and comes back."""
    _publish(client, target)
    worker = workers(FLOWFORGE_AMQP_URL=own_rabbitmq.url)
    warm = client.start("orders", {"n": -1})
    assert client.wait(warm)["status"] == "succeeded"
    target.received.clear()

    if outage == "stop_app":
        with own_rabbitmq.app_stopped():
            wait_logged(worker, "broker connection lost")
            ids = _accept_while_down(client, db, target)
    else:
        own_rabbitmq.stop()
        try:
            wait_logged(worker, "broker connection lost")
            ids = _accept_while_down(client, db, target)
        finally:
            own_rabbitmq.start()

    _all_finish(client, db, target, ids)
