"""A broker connection that dies with acks still queued on it does not stall the drain.

Promise: when the consumer's connection dies while settlements (acks) of finished steps
are queued on it but not yet sent, those settlements go with the connection — RabbitMQ
redelivers the messages, and the redeliveries are acked as stale — and the worker,
consuming again on a new connection, still drains on SIGTERM and exits 0. Found by the
randomized fault run (seed 204, `drain_stuck`): the count of unsettled deliveries was
shared by every connection, and one whose ack pika dropped with its dead connection
never came back to zero, so the drain waited for it forever.

The fault point `before_settle` holds the consumer thread just before it sends step a's
ack, so that step b's ack is handed over while the connection still looks alive, and the
proxy resets the link meanwhile — the order a loaded machine or a SIGSTOP produces by
chance.
"""

from __future__ import annotations

import signal
import threading

from tests.faults.helpers import StartWorker, logged, wait_logged
from tests.support.api import Api
from tests.support.definitions import http, workflow
from tests.support.faultproxy import FaultProxy
from tests.support.processes import wait_for
from tests.support.target import Received, Reply, Target

# What a supervisor would allow (systemd's default TimeoutStopSec is 90 s); this drain
# settles at most the two redelivered wake-ups, SETTLE_HOLD_S each.
GRACE_S = 30
SETTLE_HOLD_S = 3
# Longer than every hold of the consumer thread in this test, so the broker never drops a
# connection for missed heartbeats: the only connection that dies is the one we reset.
HEARTBEAT_S = 30


def test_acks_lost_with_their_connection_do_not_stall_the_drain(
    client: Api, workers: StartWorker, target: Target, broker_proxy: FaultProxy, amqp_url: str
) -> None:
    client.publish("fetch", workflow(http("get", "GET", f"{target.url}/item/{{{{ input.n }}}}")))
    second_may_answer = threading.Event()

    def script(request: Received) -> Reply:
        if request.path == "/item/2":
            second_may_answer.wait(timeout=GRACE_S)
        return Reply(json={"path": request.path})

    target.script = script
    url = broker_proxy.url(amqp_url)
    worker = workers(
        FLOWFORGE_AMQP_URL=f"{url}{'&' if '?' in url else '?'}heartbeat={HEARTBEAT_S}",
        FLOWFORGE_FAULTS=f"before_settle=sleep:{SETTLE_HOLD_S}",
    )
    wait_logged(worker, "consuming")
    # b first: once the consumer thread is held, it takes no new deliveries either.
    second = client.start("fetch", {"n": 2})
    wait_for(lambda: target.requests_to("/item/2"), message="b's request to arrive")
    first = client.start("fetch", {"n": 1})

    # a's ack is about to be sent; b is still waiting for its answer.
    wait_logged(worker, "fault point reached")
    broker_proxy.cut()  # the consumer thread, held, does not notice yet
    second_may_answer.set()  # b finishes and hands its ack over to the dying connection
    wait_logged(worker, "broker connection lost; consumer will reconnect")
    broker_proxy.restore()
    wait_for(lambda: len(logged(worker, "consuming")) >= 2, message="consuming again")
    assert client.wait(first, timeout=20)["status"] == "succeeded"
    assert client.wait(second, timeout=20)["status"] == "succeeded"

    worker.signal(signal.SIGTERM)
    wait_logged(worker, "draining")
    assert worker.popen.wait(timeout=GRACE_S) == 0
    assert logged(worker, "worker stopped")
    # Each request left once: the redeliveries found their steps done.
    assert sorted(r.path for r in target.requests_to("/item")) == ["/item/1", "/item/2"]
