"""Issue 23 item 5: a request that provably never left never ends `unknown`.

Worker A is frozen (SIGSTOP) right before its fence, with an unsafe POST claimed. Its
lease runs out and worker B's reaper records the attempt `unknown … may have been sent`.
When A wakes up, its fence refuses to send ("request not sent: lease not confirmed"):
the target never sees the request. That "not sent" used to be discarded as a write of a
worker that lost its lease, leaving a false `unknown` an operator might resolve as
succeeded. Now the attempt is corrected to failed (not sent) and the step retried.

The same holds when the worker that kept the request home cannot reach the database at
that moment (a partition of its link, found by the randomized run's seed 11): it tries
its checkpoint again until the link is back, instead of handing the delivery back and
leaving the reaper's `unknown` standing.
"""

from __future__ import annotations

import signal

from tests.faults.helpers import StartWorker, http, logged, wait_logged, workflow
from tests.support.api import Api, step
from tests.support.faultproxy import FaultProxy
from tests.support.processes import wait_for
from tests.support.services import through_proxy
from tests.support.target import Target

RETRY = {"max_attempts": 3, "initial_interval_s": 0.1}


def test_a_request_the_fence_kept_home_is_not_left_unknown(
    client: Api, workers: StartWorker, target: Target
) -> None:
    client.publish("charge", workflow(http("post", "POST", f"{target.url}/charge", retry=RETRY)))
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
    assert_retried_not_unknown(client, eid, target)


def test_a_request_kept_home_while_the_database_is_unreachable_is_not_left_unknown(
    client: Api,
    database_url: str,
    pg_proxy: FaultProxy,
    workers: StartWorker,
    target: Target,
) -> None:
    client.publish("charge", workflow(http("post", "POST", f"{target.url}/charge", retry=RETRY)))
    a = workers(
        FLOWFORGE_DATABASE_URL=through_proxy(database_url, pg_proxy),
        FLOWFORGE_DB_TIMEOUT_SECONDS="2",
        FLOWFORGE_FAULTS="before_request_send=sleep:4",
        FLOWFORGE_WORKER_CONCURRENCY="1",
    )
    eid = client.start("charge", {})
    wait_logged(a, "fault point reached")
    # A's link goes silent with the POST claimed: its lease is not renewed, B's reaper
    # records the attempt unknown, A's fence keeps the request home, and A's checkpoint
    # of that "not sent" cannot reach the database.
    pg_proxy.blackhole()
    try:
        workers()
        wait_for(
            lambda: step(client.execution(eid), "post")["status"] == "unknown",
            timeout=30,
            message="the reaper to record the attempt unknown",
        )
        wait_logged(a, "request not sent")
        wait_for(
            lambda: logged(a, "delivery handed back") or logged(a, "checkpoint not saved"),
            timeout=30,
            message="A's checkpoint to fail for want of the database",
        )
    finally:
        pg_proxy.restore()
    assert_retried_not_unknown(client, eid, target)


def test_a_claim_whose_commit_answer_was_lost_is_not_left_unknown(
    client: Api,
    database_url: str,
    pg_proxy: FaultProxy,
    workers: StartWorker,
    target: Target,
) -> None:
    """Issue 39 item 2: the claim's COMMIT lands, its answer is lost (a PostgreSQL stop, as
    the worker sees it). The worker used to hand the delivery back with its request unsent;
    the reaper then found the lease run out and recorded "may have been sent"."""
    client.publish("charge", workflow(http("post", "POST", f"{target.url}/charge", retry=RETRY)))
    a = workers(
        FLOWFORGE_DATABASE_URL=through_proxy(database_url, pg_proxy),
        FLOWFORGE_DB_TIMEOUT_SECONDS="2",
        FLOWFORGE_FAULTS="before_claim_commit=sleep:1",
        FLOWFORGE_WORKER_CONCURRENCY="1",
    )
    eid = client.start("charge", {})
    wait_logged(a, "fault point reached")
    # From A's next COMMIT on, the server's answers never reach A: the claim commits.
    pg_proxy.drop_replies(after=b"COMMIT")
    try:
        workers()  # B: its reaper finds the claim's lease run out
        wait_for(
            lambda: step(client.execution(eid), "post")["status"] == "unknown",
            timeout=30,
            message="the reaper to record the claimed attempt unknown",
        )
    finally:
        pg_proxy.restore()
    assert_retried_not_unknown(client, eid, target)


def assert_retried_not_unknown(client: Api, eid: str, target: Target) -> None:
    """Not needs_attention for ever: the step is retried and its second request sent."""
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
