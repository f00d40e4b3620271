"""Operator actions (docs/contract.md#operator-actions), each through the API and through the
`flowforge` CLI.

Promises: cancel stops queued and waiting work at once (202, then 200 once terminal); a
running step stops at its next boundary — its result is recorded, nothing downstream
runs, and no late worker can flip the execution afterwards. Retry re-runs only the
failed steps and reuses every completed checkpoint. `flowforge executions show` prints
the step and attempt timeline. (Resolve is proved in test_crash_after_post.py.)
"""

from __future__ import annotations

import signal
import time

import psycopg
import pytest

from tests.faults.helpers import StartWorker, cli, logged, wait_logged
from tests.support.api import Api, step
from tests.support.definitions import http, transform, workflow
from tests.support.processes import wait_for
from tests.support.target import Received, Reply, Target


def _cancel(client: Api, eid: str) -> tuple[int, str]:
    r = client.post(f"/api/v1/executions/{eid}/cancel")
    assert r.status_code in {200, 202}, r.text
    return r.status_code, r.json()["status"]


def test_cancel_stops_queued_and_waiting_work_at_once(
    client: Api, db: psycopg.Connection, env: dict[str, str], workers: StartWorker, target: Target
) -> None:
    client.publish("now", workflow(http("ping", "GET", f"{target.url}/now")))
    client.publish(
        "later",
        workflow(
            {"id": "cool_off", "type": "delay", "duration_s": 86_400},
            http("after", "GET", f"{target.url}/after", after=("cool_off",)),
        ),
    )
    # Queued: no worker has touched them yet.
    queued_api, queued_cli = client.start("now", {}), client.start("now", {})
    assert _cancel(client, queued_api) == (202, "cancelled")
    assert _cancel(client, queued_api) == (200, "cancelled")
    result = cli(env, "cancel", queued_cli)
    assert result.returncode == 0 and "is now cancelled" in result.stdout, result
    result = cli(env, "cancel", queued_cli)
    assert result.returncode == 0 and "was already cancelled" in result.stdout, result

    # Waiting: a day-long delay in progress.
    worker = workers(FLOWFORGE_LOG_LEVEL="DEBUG")
    waiting_api, waiting_cli = client.start("later", {}), client.start("later", {})
    client.wait(waiting_api, "waiting")
    client.wait(waiting_cli, "waiting")
    assert _cancel(client, waiting_api) == (202, "cancelled")
    assert _cancel(client, waiting_api) == (200, "cancelled")
    result = cli(env, "cancel", waiting_cli)
    assert result.returncode == 0 and "is now cancelled" in result.stdout, result

    for eid in (queued_api, queued_cli, waiting_api, waiting_cli):
        execution = client.execution(eid)
        assert execution["status"] == "cancelled"
        assert {s["status"] for s in execution["steps"]} == {"cancelled"}
    # The queued ones' wake-ups still reach the worker, which drops them.
    for eid in (queued_api, queued_cli):
        wait_for(
            lambda eid=eid: [
                r for r in logged(worker, "stale wake-up") if r["execution_id"] == eid
            ],
            message="the cancelled execution's wake-up to be ignored",
        )
    # Even once the day has passed, a cancelled delay never wakes.
    db.execute("UPDATE steps SET wake_at = now() - interval '1 second' WHERE step_id = 'cool_off'")
    time.sleep(2.0)
    assert target.received == []
    assert client.execution(waiting_api)["status"] == "cancelled"


def _publish_pay(client: Api, target: Target) -> None:
    """`pay`: charge (a POST), then notify (a GET), both to the target."""
    client.publish(
        "pay",
        workflow(
            http("charge", "POST", f"{target.url}/charge", json={}),
            http("notify", "GET", f"{target.url}/notify", after=("charge",)),
        ),
    )


def test_cancel_during_a_running_step_records_its_result_and_runs_nothing_after(
    client: Api, env: dict[str, str], workers: StartWorker, target: Target
) -> None:
    _publish_pay(client, target)
    target.script = lambda r: Reply(
        status=201 if r.path == "/charge" else 200,
        json={"id": "ch_1"},
        delay_s=3.0 if r.path == "/charge" else 0,
    )
    workers()
    eid = client.start("pay", {})
    wait_for(lambda: target.requests_to("/charge"), message="the charge to be in flight")

    assert _cancel(client, eid) == (202, "running")  # stops at the step's next boundary
    assert step(client.execution(eid), "notify")["status"] == "cancelled"
    done = client.wait(eid, "cancelled", timeout=30)
    charge = step(done, "charge")
    # The charge went through: a cancel around it does not make that less true.
    assert charge["status"] == "succeeded"
    assert charge["output"]["body"] == {"id": "ch_1"}
    assert [a["outcome"] for a in charge["attempts"]] == ["succeeded"]
    assert target.requests_to("/notify") == []
    assert _cancel(client, eid) == (200, "cancelled")

    # A retry carries on from the charge instead of charging again.
    result = cli(env, "retry", eid)
    assert result.returncode == 0, result.stderr
    again = client.wait(eid, "succeeded", timeout=30)
    assert len(target.requests_to("/charge")) == 1
    assert len(target.requests_to("/notify")) == 1
    assert step(again, "charge")["attempts"] == charge["attempts"]


def test_an_unknown_step_survives_cancel_and_retry_and_is_listed_as_needing_attention(
    client: Api, env: dict[str, str], workers: StartWorker, target: Target
) -> None:
    _publish_pay(client, target)
    client.publish("other", workflow(http("ping", "GET", f"{target.url}/ping")))
    target.script = lambda r: Reply(json={"id": "ch_1"}, delay_s=5.0 if r.path == "/charge" else 0)
    doomed = workers(FLOWFORGE_WORKER_ID="doomed")
    eid = client.start("pay", {})
    wait_for(lambda: target.requests_to("/charge"), message="the charge to be in flight")
    assert _cancel(client, eid) == (202, "running")
    doomed.kill()  # mid-POST: nobody will ever read the answer

    workers(FLOWFORGE_WORKER_ID="successor")  # its reaper recovers the dead worker's lease
    done = client.wait(eid, "cancelled", timeout=30)
    assert step(done, "charge")["status"] == "unknown"
    assert [a["outcome"] for a in step(done, "charge")["attempts"]] == ["unknown"]
    fine = client.start("other", {})
    assert client.wait(fine, timeout=30)["status"] == "succeeded"

    # The operator's inbox finds it, whatever the execution's own status (API and CLI).
    r = client.session.get(f"{client.base}/api/v1/executions?status=needs_attention", timeout=10)
    assert r.status_code == 200, r.text
    assert [(i["id"], i["status"]) for i in r.json()["items"]] == [(eid, "cancelled")]
    listed = cli(env, "executions", "list", "--status", "needs_attention")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[0] == "ID" and [line.split()[0] for line in rows] == [eid]

    # Cancel again and retry settle nothing and send nothing: the retry brings back the
    # cancelled `notify`, which waits behind the charge nobody has settled yet.
    assert _cancel(client, eid) == (200, "cancelled")
    r = client.post(f"/api/v1/executions/{eid}/retry")
    assert (r.status_code, r.json()["status"]) == (202, "needs_attention"), r.text
    r = client.post(f"/api/v1/executions/{eid}/retry")
    assert r.status_code == 409, r.text
    assert "resolve" in r.json()["detail"]
    time.sleep(3.0)  # longer than a lease and a reconcile interval
    after = client.execution(eid)
    assert step(after, "charge")["status"] == "unknown"
    assert step(after, "notify")["status"] == "pending"
    assert len(target.requests_to("/charge")) == 1

    # Resolved as failed by a human, then retried: now, and only now, it is sent again.
    result = cli(env, "resolve", eid, "charge", "failed")
    assert result.returncode == 0, result.stderr
    result = cli(env, "retry", eid)
    assert result.returncode == 0, result.stderr
    assert client.wait(eid, "succeeded", timeout=30)["status"] == "succeeded"
    assert len(target.requests_to("/charge")) == 2
    r = client.session.get(f"{client.base}/api/v1/executions?status=needs_attention", timeout=10)
    assert r.json()["items"] == []


def test_a_late_worker_never_flips_a_cancelled_execution(
    client: Api, env: dict[str, str], workers: StartWorker, target: Target
) -> None:
    client.publish(
        "lookup",
        workflow(
            http("fetch", "GET", f"{target.url}/fetch"),
            http("after", "GET", f"{target.url}/after", after=("fetch",)),
        ),
    )
    target.script = lambda r: Reply(json={"v": 1}, delay_s=1.0 if r.path == "/fetch" else 0)
    late = workers(FLOWFORGE_WORKER_ID="late")
    eid = client.start("lookup", {})
    wait_for(lambda: target.requests_to("/fetch"), message="the fetch to be in flight")
    late.signal(signal.SIGSTOP)
    try:
        result = cli(env, "cancel", eid)
        assert result.returncode == 0 and "cancel requested" in result.stdout, result
        workers(FLOWFORGE_WORKER_ID="reaper")  # recovers the frozen worker's lease
        done = client.wait(eid, "cancelled", timeout=30)
    finally:
        late.signal(signal.SIGCONT)

    wait_logged(late, "lost ownership")  # the late answer is refused, not written
    after = client.execution(eid)
    assert after["status"] == "cancelled"
    assert step(after, "fetch")["status"] == "cancelled"
    assert step(after, "fetch")["output"] is None
    assert [a["outcome"] for a in step(after, "fetch")["attempts"]] == ["lost_lease"]
    assert after["events"] == done["events"]
    assert target.requests_to("/after") == []


@pytest.mark.parametrize("via", ["api", "cli"])
def test_retry_reruns_only_the_failed_step_and_reuses_checkpoints(
    via: str, client: Api, env: dict[str, str], workers: StartWorker, target: Target
) -> None:
    client.publish(
        "sync",
        workflow(
            http("lookup", "GET", f"{target.url}/lookup"),
            transform("shape", {"total": "{{ lookup.body.total }}"}, after=("lookup",)),
            http("push", "POST", f"{target.url}/push", json="{{ shape }}", after=("shape",)),
            http("confirm", "GET", f"{target.url}/confirm", after=("push",)),
        ),
    )
    broken = True

    def answer(r: Received) -> Reply:
        if r.path == "/push" and broken:
            return Reply(status=500, json={"error": "down"})
        return Reply(json={"total": 250})

    target.script = answer
    workers()
    eid = client.start("sync", {})
    failed = client.wait(eid, timeout=30)
    assert failed["status"] == "failed", failed
    assert [a["outcome"] for a in step(failed, "push")["attempts"]] == ["failed"]  # unsafe POST
    assert step(failed, "confirm")["status"] == "cancelled"

    broken = False
    if via == "api":
        r = client.post(f"/api/v1/executions/{eid}/retry")
        assert r.status_code == 202, r.text
    else:
        result = cli(env, "retry", eid)
        assert result.returncode == 0, result.stderr
    done = client.wait(eid, "succeeded", timeout=30)

    assert len(target.requests_to("/lookup")) == 1  # checkpoint reused, not re-run
    assert len(target.requests_to("/push")) == 2
    assert len(target.requests_to("/confirm")) == 1
    assert step(done, "lookup")["attempts"] == step(failed, "lookup")["attempts"]
    assert step(done, "shape")["output"] == {"total": 250}
    assert target.requests_to("/push")[1].json() == {"total": 250}
    assert "execution.retried" in [e["kind"] for e in done["events"]]
    push_attempts = step(done, "push")["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in push_attempts] == [
        (1, "failed"),
        (2, "succeeded"),
    ]

    # Only finished executions that did not succeed can be retried.
    if via == "api":
        r = client.post(f"/api/v1/executions/{eid}/retry")
        assert r.status_code == 409, r.text
    else:
        result = cli(env, "retry", eid)
        assert result.returncode == 1 and "succeeded" in result.stderr, result
        shown = cli(env, "executions", "show", eid)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0].startswith(f"execution {eid}") and "succeeded" in lines[0]
        timeline = "\n".join(lines)
        for step_id in ("lookup", "shape", "push", "confirm"):
            assert any(line.split()[:1] == [step_id] for line in lines), step_id
        assert "attempt 1: failed HTTP 500" in timeline
        assert "attempt 2: succeeded HTTP 200" in timeline  # push: numbering continues
        assert timeline.count("attempt 1: succeeded HTTP 200") == 2  # lookup, confirm
