"""Case 9: SIGTERM while a long step runs.

Promise: on SIGTERM the worker takes no new work; the step it is running finishes and is
checkpointed (its heartbeat keeps the lease alive meanwhile, so no other worker steps
in); the process exits 0 within its grace period. Work that arrived after the signal
stays queued, with its wake-up still in RabbitMQ, for the next worker.
"""

from __future__ import annotations

import signal

from tests.faults.helpers import StartWorker, logged, queue_depth, wait_logged
from tests.support.api import Api, step
from tests.support.definitions import http, workflow
from tests.support.processes import wait_for
from tests.support.target import Reply, Target

# What a supervisor would allow (systemd's default TimeoutStopSec is 90 s); the step
# itself takes 3 s.
GRACE_S = 30


def test_sigterm_drains_the_running_step_and_takes_nothing_new(
    client: Api, workers: StartWorker, target: Target, amqp_url: str, amqp_prefix: str
) -> None:
    client.publish("slow", workflow(http("call", "POST", f"{target.url}/call", json="{{ input }}")))
    target.script = lambda _r: Reply(json={"ok": True}, delay_s=3.0)
    worker = workers()
    first = client.start("slow", {"n": 1})
    wait_for(lambda: target.requests_to("/call"), message="the long step to start")

    worker.signal(signal.SIGTERM)
    wait_logged(worker, "draining")
    second = client.start("slow", {"n": 2})  # arrives while the worker drains

    assert worker.popen.wait(timeout=GRACE_S) == 0
    assert logged(worker, "worker stopped")

    done = client.execution(first)
    assert done["status"] == "succeeded", done
    call = step(done, "call")
    assert [a["outcome"] for a in call["attempts"]] == ["succeeded"]  # one attempt, no takeover
    assert call["output"]["body"] == {"ok": True}

    assert client.execution(second)["status"] == "queued"
    assert [r.json() for r in target.requests_to("/call")] == [{"n": 1}]
    # Its wake-up was published by the relay but never taken: it waits in the queue (maybe
    # twice, when the reconciler re-dispatched it meanwhile; only one copy will run).
    wait_for(
        lambda: queue_depth(amqp_url, f"{amqp_prefix}.steps") >= 1,
        message="the second wake-up to wait in the queue",
    )

    workers()
    assert client.wait(second, timeout=30)["status"] == "succeeded"
    assert [r.json() for r in target.requests_to("/call")] == [{"n": 1}, {"n": 2}]
