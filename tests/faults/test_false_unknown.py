"""Issue 23 item 5: a request that provably never left never ends `unknown`.

Worker A is frozen (SIGSTOP) right before its fence, with an unsafe POST claimed. Its
lease runs out and worker B's reaper records the attempt `unknown … may have been sent`.
When A wakes up, its fence refuses to send ("request not sent: lease not confirmed"):
the target never sees the request. That "not sent" used to be discarded as a write of a
worker that lost its lease, leaving a false `unknown` an operator might resolve as
succeeded. Now the attempt is corrected to failed (not sent) and the step retried.
"""

from __future__ import annotations

import signal

from tests.faults.helpers import StartWorker, http, wait_logged, workflow
from tests.support.api import Api, step
from tests.support.processes import wait_for
from tests.support.target import Target


def test_a_request_the_fence_kept_home_is_not_left_unknown(
    client: Api, workers: StartWorker, target: Target
) -> None:
    retry = {"max_attempts": 3, "initial_interval_s": 0.1}
    client.publish("charge", workflow(http("post", "POST", f"{target.url}/charge", retry=retry)))
    a = workers(FLOWFORGE_FAULTS="before_request_send=sleep:1", FLOWFORGE_WORKER_CONCURRENCY="1")
    eid = client.start("charge", {})
    wait_logged(a, "fault point reached")
    a.signal(signal.SIGSTOP)
    try:
        workers()  # B: its reaper recovers A's lapsed lease
        wait_for(
            lambda: step(client.execution(eid), "post")["status"] == "unknown",
            timeout=30,
            message="the reaper to record the attempt unknown",
        )
    finally:
        a.signal(signal.SIGCONT)
    wait_logged(a, "request not sent")
    # Not needs_attention for ever: the step is retried and its second request is sent.
    done = wait_for(
        lambda: (e := client.execution(eid))["status"] in {"succeeded", "failed"} and e,
        timeout=60,
        message="the execution to finish without an operator",
    )
    post = step(done, "post")
    outcomes = [attempt["outcome"] for attempt in post["attempts"]]
    assert done["status"] == "succeeded", done
    assert outcomes[0] == "failed" and "not sent" in post["attempts"][0]["error"], outcomes
    assert "unknown" not in outcomes
    assert len(target.requests_to("/charge")) == 1  # the first request never left
