"""Case 6: lost and duplicated RabbitMQ messages.

Promise: RabbitMQ only carries wake-ups, so losing them loses nothing — with the steps
queue purged and the worker's broker connections dropped mid-run, the reconciler
re-dispatches every `ready` step from PostgreSQL and every execution finishes, each step
run once. A wake-up delivered several times runs its step once: duplicates are stopped
by the state check under the execution's row lock.
"""

from __future__ import annotations

import psycopg

from flowforge.worker.broker import Topology
from tests.faults.helpers import (
    StartWorker,
    channel,
    logged,
    publish_wakeup,
    queue_depth,
    scalar,
    succeeded_twice,
    wait_logged,
)
from tests.support.api import Api, step
from tests.support.definitions import http, workflow
from tests.support.faultproxy import FaultProxy
from tests.support.processes import wait_for
from tests.support.target import Received, Reply, Target

RUNS = 10


def test_purged_queue_and_dropped_connections_still_finish_every_execution(
    client: Api,
    db: psycopg.Connection,
    workers: StartWorker,
    target: Target,
    broker_proxy: FaultProxy,
    amqp_url: str,
    amqp_prefix: str,
) -> None:
    client.publish(
        "chain",
        workflow(
            http("a", "GET", f"{target.url}/a/{{{{ input.n }}}}"),
            http("b", "GET", f"{target.url}/b/{{{{ input.n }}}}", after=("a",)),
            http("c", "GET", f"{target.url}/c/{{{{ input.n }}}}", after=("b",)),
        ),
    )

    def pace(r: Received) -> Reply:
        return Reply(json={"ok": True}, delay_s=1.5 if r.path.startswith("/a/") else 0.1)

    target.script = pace
    worker = workers(FLOWFORGE_AMQP_URL=broker_proxy.url(amqp_url))
    ids = [client.start("chain", {"n": n}) for n in range(RUNS)]

    # Four executors are busy with step a (prefetch = concurrency = 4); the other six
    # wake-ups sit ready in the queue. Purge them: those messages are gone for good —
    # once the relay committed their batch. Until then its outbox rows are still there,
    # and a broker lost before that commit has them published again, not reconciled.
    queue = f"{amqp_prefix}.steps"
    wait_for(lambda: len(target.requests_to("/a/")) >= 4, message="four steps in flight")
    wait_for(
        lambda: scalar(db, "SELECT count(*) FROM outbox") == 0,
        message="the relay to commit the published wake-ups",
    )
    wait_for(lambda: queue_depth(amqp_url, queue) >= 1, message="wake-ups waiting in the queue")
    with channel(amqp_url) as ch:
        purged = ch.queue_purge(queue).method.message_count
    assert purged >= 1

    # And drop the worker's broker connections while those four are in flight.
    broker_proxy.cut()
    wait_logged(worker, "broker connection lost")
    wait_for(
        lambda: logged(worker, "re-dispatched ready steps"),
        timeout=20,
        message="the reconciler to notice lost wake-ups",
    )
    broker_proxy.restore()

    for eid in ids:
        assert client.wait(eid, timeout=90)["status"] == "succeeded"
    for name in ("a", "b", "c"):
        assert sorted(r.path for r in target.requests_to(f"/{name}/")) == sorted(
            f"/{name}/{n}" for n in range(RUNS)
        ), name
    assert succeeded_twice(db) == []
    print(f"purged {purged} wake-ups; every execution finished")


def test_a_wakeup_delivered_three_times_runs_the_post_once(
    client: Api,
    db: psycopg.Connection,
    workers: StartWorker,
    target: Target,
    amqp_url: str,
    amqp_prefix: str,
) -> None:
    client.publish(
        "once",
        workflow(
            http("charge", "POST", f"{target.url}/charge", json={"amount": 5}),
            http("after", "GET", f"{target.url}/after", after=("charge",)),
        ),
    )
    target.script = lambda r: Reply(json={"ok": True}, delay_s=1.0 if r.path == "/charge" else 0)
    with channel(amqp_url) as ch:
        Topology(amqp_prefix).declare(ch)  # what any worker declares, before one exists
    eid = client.start("once", {})
    # The outbox row will be published by the relay; two more copies arrive before it.
    publish_wakeup(amqp_url, amqp_prefix, eid, "charge")
    publish_wakeup(amqp_url, amqp_prefix, eid, "charge")
    assert queue_depth(amqp_url, f"{amqp_prefix}.steps") == 2

    worker = workers(FLOWFORGE_LOG_LEVEL="DEBUG")
    done = client.wait(eid, timeout=30)
    assert done["status"] == "succeeded", done
    # Late duplicate, after the step finished.
    publish_wakeup(amqp_url, amqp_prefix, eid, "charge")

    def stale() -> list[dict]:
        found = [r for r in logged(worker, "stale wake-up ignored") if r.get("step") == "charge"]
        return found if len(found) >= 3 else []

    wait_for(stale, timeout=20, message="three duplicate wake-ups to be ignored")
    assert len(target.requests_to("/charge")) == 1
    assert len(target.requests_to("/after")) == 1
    charge = step(client.execution(eid), "charge")
    assert charge["attempt_count"] == 1
    assert [a["outcome"] for a in charge["attempts"]] == ["succeeded"]
    assert succeeded_twice(db) == []


def test_a_consumer_the_broker_cancels_consumes_again(
    client: Api,
    workers: StartWorker,
    target: Target,
    amqp_url: str,
    amqp_prefix: str,
) -> None:
    """The broker cancels a consumer whose queue went away (deleted, or its quorum
    leader lost with the consumer on another node) on a connection that stays up: the
    worker must consume again, not sit on a healthy connection that delivers nothing."""
    client.publish("one", workflow(http("a", "GET", f"{target.url}/a")))
    worker = workers()
    assert client.wait(client.start("one", {}), timeout=30)["status"] == "succeeded"
    with channel(amqp_url) as ch:
        ch.queue_delete(f"{amqp_prefix}.steps")
    wait_for(
        lambda: [r for r in logged(worker, "consumer will reconnect") if "cancelled" in r["error"]],
        message="the consumer to hear of its cancel",
    )
    done = client.wait(client.start("one", {}), timeout=30)
    assert done["status"] == "succeeded", done
    assert len(target.requests_to("/a")) == 2
