"""Resumes of wait steps survive what webhooks survive (docs/contract.md#wait,
docs/contract.md#delivery).

Promises: a resume commits its step's success and the next step's wake-up in one
transaction, so a worker killed right after that commit loses nothing — the next worker
runs the next step; and a resume is accepted (202) while the worker cannot reach
RabbitMQ, because the API writes only to PostgreSQL: the execution goes on once the
broker is back.
"""

from __future__ import annotations

import time

import psycopg

from tests.faults.helpers import StartWorker, scalar
from tests.integration.test_wait_step import approval, post, resume_url
from tests.support.api import Api, step
from tests.support.faultproxy import FaultProxy
from tests.support.target import Target

NEXT_STEP_WAKEUPS = "SELECT count(*) FROM outbox WHERE step_id = 'ship'"


def test_a_worker_killed_after_the_resume_committed_loses_nothing(
    client: Api, api: str, workers: StartWorker, target: Target, db: psycopg.Connection
) -> None:
    first = workers(FLOWFORGE_PUBLIC_URL=api)
    client.publish("approval", approval(target))
    eid = client.start("approval", {"order": 1})
    client.wait(eid, "waiting")
    url = resume_url(target)
    first.kill()  # SIGKILL: no worker at all when the resume commits

    assert post(url, {"approved": True}).status_code == 202
    # What the resume committed: the step's success and the next step's wake-up.
    after = client.execution(eid)
    assert step(after, "approval")["status"] == "succeeded"
    assert step(after, "ship")["status"] == "ready"
    assert scalar(db, NEXT_STEP_WAKEUPS) == 1

    workers(FLOWFORGE_PUBLIC_URL=api)
    done = client.wait(eid)
    assert done["status"] == "succeeded", done
    assert [r.json() for r in target.requests_to("/ship")] == [{"approved": {"approved": True}}]


def test_a_resume_while_the_worker_cannot_reach_rabbitmq_is_accepted_and_goes_on(
    client: Api,
    api: str,
    workers: StartWorker,
    target: Target,
    db: psycopg.Connection,
    broker_proxy: FaultProxy,
    amqp_url: str,
) -> None:
    workers(FLOWFORGE_PUBLIC_URL=api, FLOWFORGE_AMQP_URL=broker_proxy.url(amqp_url))
    client.publish("approval", approval(target))
    eid = client.start("approval", {"order": 2})
    client.wait(eid, "waiting")
    url = resume_url(target)
    broker_proxy.cut()  # the worker's relay and consumer lose RabbitMQ; the API never had it

    assert post(url, {"approved": "while down"}).status_code == 202
    time.sleep(1.5)  # long enough for a relay that could publish to have published
    assert target.requests_to("/ship") == []
    assert scalar(db, NEXT_STEP_WAKEUPS) == 1  # the wake-up waits in the outbox

    broker_proxy.restore()
    done = client.wait(eid, timeout=60)
    assert done["status"] == "succeeded", done
    assert [r.json() for r in target.requests_to("/ship")] == [
        {"approved": {"approved": "while down"}}
    ]
