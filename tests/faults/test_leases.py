"""Leases at their edges: a lease exists only after its claim committed, a request leaves
only while its worker knows the lease is still its own, and a frozen worker's prefetched
wake-ups do not hold up the takeover.

Promises (docs/contract.md#leases), each against real bin/worker processes with 2 s leases:
- The claim's COMMIT lands but its answer is lost (connection reset through a TCP proxy
  in front of PostgreSQL): the worker never starts a lease it does not know it has, so
  nothing renews it; the lease runs out, the step is recovered and runs once.
- A worker frozen between its claim and the send, whose step was meanwhile recovered and
  settled by an operator, wakes up and does not send: its local lease deadline passed.
- A worker frozen while holding a lease, with the re-dispatched wake-up stuck in its
  prefetch: another worker still finishes the step within a few lease periods, long
  before the reconcile interval.
"""

from __future__ import annotations

import signal
import threading
import time

import psycopg

from tests.faults.helpers import StartWorker, cli, http, logged, scalar, wait_logged, workflow
from tests.support.api import Api, step
from tests.support.faultproxy import FaultProxy
from tests.support.processes import wait_for
from tests.support.services import through_proxy
from tests.support.target import Received, Reply, Target

LEASE_S = 2.0


def _step_status(db: psycopg.Connection, eid: str, sid: str) -> str:
    return scalar(
        db,
        "SELECT status FROM steps WHERE execution_id = %(e)s AND step_id = %(s)s",
        {"e": eid, "s": sid},
    )


def test_a_claim_whose_commit_answer_is_lost_is_never_renewed_and_is_recovered(
    client: Api,
    db: psycopg.Connection,
    workers: StartWorker,
    target: Target,
    pg_proxy: FaultProxy,
    database_url: str,
) -> None:
    retry = {"max_attempts": 5, "initial_interval_s": 0.1}
    client.publish("lookup", workflow(http("fetch", "GET", f"{target.url}/orders/1", retry=retry)))
    target.script = lambda _r: Reply(json={"ok": True})
    # Every claim pauses before its COMMIT (for less than half a lease, so its request
    # may still leave): time for the test to arm the proxy.
    worker = workers(
        FLOWFORGE_WORKER_ID="worker-A",
        FLOWFORGE_DATABASE_URL=through_proxy(database_url, pg_proxy),
        FLOWFORGE_FAULTS="before_claim_commit=sleep:0.7",
    )
    eid = client.start("lookup", {})
    wait_logged(worker, "fault point reached")
    # The COMMIT will reach PostgreSQL; its answer will not reach the worker.
    pg_proxy.drop_replies(after=b"COMMIT")
    wait_for(lambda: _step_status(db, eid, "fetch") == "running", message="the claim to commit")
    pg_proxy.cut()
    pg_proxy.restore()

    done = client.wait(eid, timeout=30)
    assert done["status"] == "succeeded", done
    attempts = step(done, "fetch")["attempts"]
    outcomes = [a["outcome"] for a in attempts]
    # The first claim is settled as never sent: by the worker itself once the database
    # answers again ("not sent: … the claim's commit got no answer",
    # docs/contract.md#no-false-unknown), or, where its unrenewed lease ran out first, by
    # the reaper (lost_lease). A later claim slowed past half a lease by a loaded machine may add
    # a not-sent attempt in between; never a sent one.
    first = attempts[0]
    assert first["outcome"] == "lost_lease" or (
        first["outcome"] == "failed" and first["error"].startswith("not sent")
    ), attempts
    assert outcomes[-1] == "succeeded", outcomes
    # The first claim's request never left: the worker did not know it held the step.
    assert len(target.requests_to("/orders/1")) == 1


def test_a_worker_frozen_before_the_send_does_not_send_after_its_lease_was_taken(
    client: Api, db: psycopg.Connection, workers: StartWorker, target: Target, env: dict
) -> None:
    client.publish("pay", workflow(http("charge", "POST", f"{target.url}/charge", json={})))
    target.script = lambda _r: Reply(status=201, json={"id": "ch_1"})
    frozen = workers(FLOWFORGE_WORKER_ID="frozen", FLOWFORGE_FAULTS="before_request_send=sleep:2")
    eid = client.start("pay", {})
    wait_logged(frozen, "fault point reached")
    frozen.signal(signal.SIGSTOP)  # claimed and committed; the POST has not left
    try:
        workers(FLOWFORGE_WORKER_ID="successor")
        unknown = client.wait(eid, "needs_attention", timeout=30)
        assert step(unknown, "charge")["status"] == "unknown"
        # The operator checked with the provider: nothing was charged; they settle it.
        settled = cli(env, "resolve", eid, "charge", "failed")
        assert settled.returncode == 0, settled.stderr
        assert client.wait(eid, "failed", timeout=10)["status"] == "failed"
    finally:
        frozen.signal(signal.SIGCONT)

    # It woke up and kept the POST home: the operator's decision stands, and only the
    # attempt is made true — it no longer says a request that never left may have left.
    wait_logged(frozen, "its attempt corrected")
    assert target.requests_to("/charge") == [], "the frozen worker sent the POST after all"
    refused = logged(frozen, "request not sent")
    assert refused and refused[0]["execution_id"] == eid and refused[0]["step"] == "charge"
    done = client.execution(eid)
    charge = step(done, "charge")
    assert (done["status"], charge["status"]) == ("failed", "failed"), done
    assert [a["outcome"] for a in charge["attempts"]] == ["failed"], charge["attempts"]
    assert "not sent" in charge["attempts"][0]["error"]


def test_a_frozen_worker_holding_the_wakeup_in_its_prefetch_does_not_delay_the_takeover(
    client: Api, db: psycopg.Connection, workers: StartWorker, target: Target
) -> None:
    client.publish(
        "lookup",
        workflow(
            http(
                "fetch",
                "GET",
                f"{target.url}/{{{{ input.kind }}}}",
                retry={"max_attempts": 3, "initial_interval_s": 0.1},
            )
        ),
    )
    b_released = threading.Event()

    def answer(r: Received) -> Reply:
        if r.path == "/busy":
            # B's own step keeps B's only executor (and prefetch slot) busy while the
            # takeover is dispatched: the wake-up can only go to A's free prefetch.
            b_released.wait(30)
        first_hang = r.path == "/hang" and len(target.requests_to("/hang")) == 1
        return Reply(json={"path": r.path}, delay_s=30.0 if first_hang else 0.0)

    target.script = answer
    b = workers(
        FLOWFORGE_WORKER_ID="worker-B",
        FLOWFORGE_WORKER_CONCURRENCY="1",
        FLOWFORGE_RECONCILE_SECONDS="60",
    )
    try:
        busy = client.start("lookup", {"kind": "busy"})
        wait_for(lambda: target.requests_to("/busy"), message="B busy with its own step")
        a = workers(FLOWFORGE_WORKER_ID="worker-A", FLOWFORGE_RECONCILE_SECONDS="60")
        eid = client.start("lookup", {"kind": "hang"})
        wait_for(lambda: target.requests_to("/hang"), message="A's request in flight")
        a.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        # B recovers A's lease; the retry's wake-up is published while B is still busy.
        wait_for(
            lambda: _step_status(db, eid, "fetch") == "ready" and not _queued(db, eid),
            timeout=20,
            message="the recovered step to be re-dispatched",
        )
    finally:
        b_released.set()
    try:
        done = client.wait(eid, timeout=30)
        taken_over_s = time.monotonic() - frozen_at
    finally:
        a.signal(signal.SIGCONT)
    assert done["status"] == "succeeded", done
    assert [(x["worker"], x["outcome"]) for x in step(done, "fetch")["attempts"]] == [
        ("worker-A", "lost_lease"),
        ("worker-B", "succeeded"),
    ]
    assert client.wait(busy, timeout=10)["status"] == "succeeded"
    assert logged(b, "recovering expired lease")
    print(f"takeover finished {taken_over_s:.1f} s after the freeze (lease {LEASE_S:g} s)")
    # Within a few lease periods of the hang, not the reconcile interval (60 s here) nor
    # the 30 s the broker took with a fixed 10 s heartbeat.
    assert taken_over_s < 6 * LEASE_S


def _queued(db: psycopg.Connection, eid: str) -> bool:
    """Whether a wake-up for the execution still waits in the outbox (not yet published)."""
    return bool(scalar(db, "SELECT count(*) FROM outbox WHERE execution_id = %(e)s", {"e": eid}))
