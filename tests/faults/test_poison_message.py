"""Case 10: a poison message.

Promise: a message that is not a wake-up — garbage bytes, JSON of the wrong shape, a
bad id, JSON nested deep enough to break a naive parser — is rejected into the
dead-letter queue `<prefix>.dead` without its body being logged, and the worker keeps
processing good work. A wake-up whose handling fails twice is dead-lettered too, and
counted against its step, so the reconciler re-dispatches it ever more rarely (a wake-up
that was merely lost is not counted: it is re-dispatched every interval).
"""

from __future__ import annotations

import psycopg

from tests.faults.helpers import (
    StartWorker,
    channel,
    logged,
    publish_raw,
    publish_wakeup,
    queue_depth,
    scalar,
)
from tests.support.api import Api
from tests.support.definitions import http, workflow
from tests.support.processes import wait_for
from tests.support.target import Target

POISON = [
    b"\x00\xffnot json at all \xfe",
    b'{"execution_id": "SECRET-CANARY", "step_id": "x"}',
    b'["execution_id", "step_id"]',
    b"[" * 100_000 + b"]" * 100_000,
]


def test_poison_goes_to_the_dead_letter_queue_and_work_goes_on(
    client: Api, workers: StartWorker, target: Target, amqp_url: str, amqp_prefix: str
) -> None:
    client.publish("ok", workflow(http("ping", "GET", f"{target.url}/ping/{{{{ input.n }}}}")))
    worker = workers()
    for body in POISON:
        publish_raw(amqp_url, amqp_prefix, body)

    dead = f"{amqp_prefix}.dead"
    wait_for(lambda: queue_depth(amqp_url, dead) == len(POISON), message="poison dead-lettered")
    with channel(amqp_url) as ch:
        bodies = []
        for _ in POISON:
            _method, _props, body = ch.basic_get(dead, auto_ack=True)
            bodies.append(body)
    assert sorted(bodies) == sorted(POISON)

    eids = [client.start("ok", {"n": n}) for n in range(3)]
    for eid in eids:
        assert client.wait(eid, timeout=30)["status"] == "succeeded"
    assert sorted(r.path for r in target.received) == ["/ping/0", "/ping/1", "/ping/2"]

    assert len(logged(worker, "malformed message dead-lettered")) == len(POISON)
    assert "SECRET-CANARY" not in worker.log()  # never the body in the log
    assert worker.popen.poll() is None
    assert queue_depth(amqp_url, f"{amqp_prefix}.steps") == 0


FAILED_WAKEUPS = """
SELECT failed_wakeups FROM steps WHERE execution_id = %(id)s AND step_id = 'ghost'
"""
# A ready step its definition does not know: written the way no correct code path can,
# so handling its wake-up is a bug, not an outage.
GHOST = """
INSERT INTO steps (execution_id, step_id, type, position, status)
VALUES (%(id)s, 'ghost', 'http_request', 9, 'ready')
"""


def test_a_wake_up_that_fails_twice_is_dead_lettered_and_counted(
    client: Api,
    workers: StartWorker,
    target: Target,
    amqp_url: str,
    amqp_prefix: str,
    db: psycopg.Connection,
) -> None:
    client.publish("nap", workflow({"id": "sleep", "type": "delay", "duration_s": 60}))
    eid = client.start("nap", {})
    db.execute(GHOST, {"id": eid})
    worker = workers()
    publish_wakeup(amqp_url, amqp_prefix, eid, "ghost")
    dead = f"{amqp_prefix}.dead"
    wait_for(lambda: queue_depth(amqp_url, dead) == 1, message="failing wake-up dead-lettered")
    wait_for(lambda: scalar(db, FAILED_WAKEUPS, {"id": eid}) == 1, message="failed wake-up counted")
    assert len(logged(worker, "wake-up failed")) == 2  # handed back once, then dead-lettered
    assert target.received == []
    assert worker.popen.poll() is None
