"""Case 3: a worker hangs mid-step and another takes over.

Promise: worker A, frozen with SIGSTOP while its request is in flight, loses the step
when its 2 s lease runs out; worker B recovers it (a GET is safe to repeat), runs it and
finishes the execution. When A wakes up with its old answer, the fencing token rejects
its write and A says so in its log; A's attempt is `lost_lease`; the output is B's, and
the step succeeded exactly once.
"""

from __future__ import annotations

import signal
import threading

import psycopg

from tests.faults.helpers import StartWorker, logged, rows, succeeded_twice, wait_logged
from tests.support.api import Api, step
from tests.support.definitions import http, transform, workflow
from tests.support.processes import wait_for
from tests.support.target import Received, Reply, Target


def test_frozen_worker_is_fenced_off_and_the_new_owner_wins(
    client: Api, db: psycopg.Connection, workers: StartWorker, target: Target
) -> None:
    client.publish(
        "lookup",
        workflow(
            http("fetch", "GET", f"{target.url}/orders/1"),
            transform("shape", {"answered_by": "{{ fetch.body.answer }}"}, after=("fetch",)),
        ),
    )
    served = []
    lock = threading.Lock()

    def answer(_req: Received) -> Reply:
        # Each request gets its own answer, so the test can tell whose result was kept.
        with lock:
            served.append(len(served) + 1)
            n = served[-1]
        return Reply(json={"answer": f"request-{n}"}, delay_s=1.0 if n == 1 else 0.0)

    target.script = answer
    a = workers(FLOWFORGE_WORKER_ID="worker-A")
    eid = client.start("lookup", {})
    wait_for(lambda: target.requests_to("/orders/1"), message="worker A's request")
    a.signal(signal.SIGSTOP)  # A is inside its request: the target holds it for 1 s
    try:
        b = workers(FLOWFORGE_WORKER_ID="worker-B")
        done = client.wait(eid, timeout=30)
    finally:
        a.signal(signal.SIGCONT)

    assert done["status"] == "succeeded", done
    fetch = step(done, "fetch")
    assert fetch["output"]["body"] == {"answer": "request-2"}
    assert step(done, "shape")["output"] == {"answered_by": "request-2"}
    assert [(x["worker"], x["outcome"]) for x in fetch["attempts"]] == [
        ("worker-A", "lost_lease"),
        ("worker-B", "succeeded"),
    ]

    # A wakes up holding request-1's answer; every write it tries is refused.
    rejected = wait_logged(a, "lost ownership")
    assert rejected[0]["execution_id"] == eid and rejected[0]["step"] == "fetch"
    assert rejected[0]["outcome"] == "succeeded"
    assert logged(b, "recovering expired lease")
    after = client.execution(eid)
    assert after["status"] == "succeeded"
    assert step(after, "fetch")["output"]["body"] == {"answer": "request-2"}
    assert len(target.requests_to("/orders/1")) == 2
    assert succeeded_twice(db) == []
    assert rows(
        db,
        "SELECT count(*) FROM execution_events WHERE step_id = 'fetch' AND kind = 'step.succeeded'",
    ) == [(1,)]
