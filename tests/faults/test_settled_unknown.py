"""Issue 39 item 3: a certain answer is never thrown away.

When a worker's lease runs out with an unsafe request in flight (it was frozen, or its
link to PostgreSQL was down for longer than the lease), another worker's reaper records
the attempt `unknown`: from the database's side the request may have been sent. But the
worker that sent it may then receive the answer. That answer used to be discarded ("lost
ownership of the step"), leaving an operator to guess what the worker knew. Now the
worker that holds the answer settles the `unknown` — fenced: the same attempt's token,
and only while no operator has acted on it — and the history says so (`step.settled`).
"""

from __future__ import annotations

import signal

from tests.faults.helpers import StartWorker, http, logged, wait_logged, workflow
from tests.support.api import Api, step
from tests.support.faultproxy import FaultProxy
from tests.support.processes import wait_for
from tests.support.services import through_proxy
from tests.support.target import Reply, Target


def _unknown(client: Api, eid: str) -> bool:
    return step(client.execution(eid), "post")["status"] == "unknown"


def assert_settled(client: Api, eid: str, target: Target) -> None:
    # needs_attention is terminal too: wait for what the answer settles it to.
    done = client.wait(eid, {"succeeded", "failed", "cancelled"}, timeout=30)
    post = step(done, "post")
    assert done["status"] == "succeeded", done
    assert [a["outcome"] for a in post["attempts"]] == ["succeeded"], post["attempts"]
    kinds = [e["kind"] for e in done["events"]]
    assert "step.settled" in kinds, kinds
    assert len(target.requests_to("/charge")) == 1


def test_a_frozen_worker_settles_the_reapers_unknown_with_its_answer(
    client: Api, workers: StartWorker, target: Target
) -> None:
    client.publish("charge", workflow(http("post", "POST", f"{target.url}/charge", json={})))
    a = workers(FLOWFORGE_FAULTS="after_http_response=sleep:1", FLOWFORGE_WORKER_CONCURRENCY="1")
    eid = client.start("charge", {})
    wait_logged(a, "fault point reached")  # the 200 is in A's hand
    a.signal(signal.SIGSTOP)
    try:
        workers()  # B: its reaper finds A's lease run out
        wait_for(lambda: _unknown(client, eid), timeout=30, message="the reaper's unknown")
        assert client.execution(eid)["status"] == "needs_attention"
    finally:
        a.signal(signal.SIGCONT)
    assert_settled(client, eid, target)
    assert logged(a, "the reaper's unknown settled by the request's answer")


def test_an_answer_received_during_an_outage_longer_than_the_lease_settles_the_unknown(
    client: Api,
    database_url: str,
    pg_proxy: FaultProxy,
    workers: StartWorker,
    target: Target,
) -> None:
    client.publish("charge", workflow(http("post", "POST", f"{target.url}/charge", json={})))
    target.script = lambda r: Reply(json={"charged": True}, delay_s=4.0)
    a = workers(
        FLOWFORGE_DATABASE_URL=through_proxy(database_url, pg_proxy),
        FLOWFORGE_DB_TIMEOUT_SECONDS="2",
        FLOWFORGE_WORKER_CONCURRENCY="1",
    )
    eid = client.start("charge", {})
    wait_for(lambda: target.requests_to("/charge"), timeout=30, message="the POST to leave")
    # A's database is gone for longer than the lease (2 s) while its request is out.
    pg_proxy.blackhole()
    try:
        workers()
        wait_for(lambda: _unknown(client, eid), timeout=30, message="the reaper's unknown")
        wait_for(
            lambda: logged(a, "checkpoint not saved"),
            timeout=30,
            message="A to hold the answer and fail to save it",
        )
    finally:
        pg_proxy.restore()
    assert_settled(client, eid, target)
