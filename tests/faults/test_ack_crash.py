"""Case 7: SIGKILL between the checkpoint commit and the ack.

Promise: the ack comes after the commit, so a crash in between leaves a message the
broker delivers again — and that redelivery does not repeat the step, because the
checkpoint already moved it past `ready`. The fault point `before_ack` kills the worker
at exactly that line.
"""

from __future__ import annotations

import psycopg

from tests.faults.helpers import StartWorker, logged, queue_depth, succeeded_twice
from tests.support.api import Api, step
from tests.support.definitions import http, workflow
from tests.support.processes import wait_for
from tests.support.target import Target


def test_redelivery_after_a_crash_before_the_ack_does_not_repeat_the_step(
    client: Api,
    db: psycopg.Connection,
    workers: StartWorker,
    target: Target,
    amqp_url: str,
    amqp_prefix: str,
) -> None:
    client.publish("once", workflow(http("charge", "POST", f"{target.url}/charge", json={})))
    crashing = workers(FLOWFORGE_FAULTS="before_ack=kill")
    eid = client.start("once", {})
    wait_for(lambda: crashing.popen.poll() is not None, message="the armed worker to die")
    assert crashing.popen.returncode == -9
    assert logged(crashing, "fault point reached")[0]["fault"] == "before_ack"

    # The checkpoint committed: the step is done before any redelivery.
    committed = client.execution(eid)
    assert committed["status"] == "succeeded"
    assert step(committed, "charge")["attempt_count"] == 1
    # The broker holds the unacked wake-up again, ready for the next worker.
    queue = f"{amqp_prefix}.steps"
    wait_for(lambda: queue_depth(amqp_url, queue) == 1, message="the wake-up to be requeued")

    successor = workers(FLOWFORGE_LOG_LEVEL="DEBUG")
    ignored = wait_for(
        lambda: [
            r for r in logged(successor, "stale wake-up ignored") if r.get("step") == "charge"
        ],
        message="the redelivered wake-up to be handled",
    )
    assert ignored[0]["execution_id"] == eid
    wait_for(lambda: queue_depth(amqp_url, queue) == 0, message="the redelivery to be acked")

    done = client.execution(eid)
    assert done["status"] == "succeeded"
    assert len(target.requests_to("/charge")) == 1
    charge = step(done, "charge")
    assert charge["attempt_count"] == 1
    assert [a["outcome"] for a in charge["attempts"]] == ["succeeded"]
    assert succeeded_twice(db) == []
