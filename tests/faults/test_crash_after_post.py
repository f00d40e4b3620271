"""Case 4: a worker crashes right after sending a POST.

Promise: a request that is not safe to repeat is never sent twice. When its worker dies
after the request left — SIGKILL while the target holds it, or the named fault point
`after_http_response` — the next owner does not send it again: the attempt becomes
`unknown`, the step `unknown`, the execution `needs_attention`, and an operator settles
it through `POST .../steps/{step}/resolve` or `flowforge resolve` (succeeded with an
output, and the execution carries on with it; or failed). A request that carries an
`idempotency_key` is safe: it is sent again with the same `Idempotency-Key` header.
A read timeout after the request was sent is `unknown` too.
"""

from __future__ import annotations

import time

from tests.faults.helpers import StartWorker, cli
from tests.support.api import Api, step
from tests.support.definitions import http, workflow
from tests.support.processes import wait_for
from tests.support.target import Received, Reply, Target

# After needs_attention, how long to keep watching that nothing re-sends the POST:
# longer than a lease and a reconcile interval.
SETTLE_S = 3.0


def _charge_workflow(target: Target, **request: object) -> dict:
    """charge (POST) → receipt (GET that uses charge's output) → summary (transform)."""
    return workflow(
        http("charge", "POST", f"{target.url}/charge", json="{{ input }}", **request),
        http(
            "receipt", "GET", f"{target.url}/receipts/{{{{ charge.body.id }}}}", after=("charge",)
        ),
        {
            "id": "summary",
            "type": "transform",
            "depends_on": ["receipt"],
            "output": {"charge": "{{ charge.body.id }}", "receipt": "{{ receipt.body.ok }}"},
        },
    )


def _assert_unknown(execution: dict) -> None:
    assert execution["status"] == "needs_attention", execution
    charge = step(execution, "charge")
    assert charge["status"] == "unknown"
    assert [a["outcome"] for a in charge["attempts"]] == ["unknown"]
    assert step(execution, "receipt")["status"] == "pending"


def test_sigkill_while_the_target_holds_the_post_makes_it_unknown_then_resolve_via_api(
    client: Api, workers: StartWorker, target: Target
) -> None:
    client.publish("pay", _charge_workflow(target))
    target.script = lambda r: Reply(
        json={"id": "ch_1"} if r.path == "/charge" else {"ok": True},
        delay_s=3.0 if r.path == "/charge" else 0.0,
    )
    first = workers(FLOWFORGE_WORKER_ID="crashing")
    eid = client.start("pay", {"amount": 10})
    wait_for(lambda: target.requests_to("/charge"), message="the POST to reach the target")
    first.kill()  # the POST left; its answer never will be read

    workers(FLOWFORGE_WORKER_ID="successor")
    _assert_unknown(client.wait(eid, "needs_attention", timeout=30))
    time.sleep(SETTLE_S)
    assert len(target.requests_to("/charge")) == 1
    assert client.execution(eid)["status"] == "needs_attention"

    # The operator checked with the payment provider: it went through as ch_9.
    resolved = client.post(
        f"/api/v1/executions/{eid}/steps/charge/resolve",
        {"outcome": "succeeded", "output": {"status": 201, "body": {"id": "ch_9"}}},
    )
    assert resolved.status_code == 200, resolved.text
    done = client.wait(eid, timeout=30)
    assert done["status"] == "succeeded", done
    assert [r.path for r in target.requests_to("/receipts/")] == ["/receipts/ch_9"]
    assert step(done, "summary")["output"] == {"charge": "ch_9", "receipt": True}
    assert len(target.requests_to("/charge")) == 1
    again = client.post(
        f"/api/v1/executions/{eid}/steps/charge/resolve", {"outcome": "succeeded", "output": {}}
    )
    assert again.status_code == 409  # only unknown steps are settled, and only once


def test_fault_point_after_the_response_then_resolve_failed_via_cli(
    client: Api, env: dict[str, str], workers: StartWorker, target: Target
) -> None:
    client.publish("pay", _charge_workflow(target))
    target.script = lambda r: Reply(json={"id": "ch_2"})
    crashing = workers(FLOWFORGE_FAULTS="after_http_response=kill")
    eid = client.start("pay", {"amount": 20})
    wait_for(lambda: crashing.popen.poll() is not None, message="the armed worker to die")
    assert crashing.popen.returncode == -9

    workers()
    _assert_unknown(client.wait(eid, "needs_attention", timeout=30))
    time.sleep(SETTLE_S)
    assert len(target.requests_to("/charge")) == 1

    result = cli(env, "resolve", eid, "charge", "failed")
    assert result.returncode == 0, result.stderr
    assert "failed" in result.stdout
    done = client.execution(eid)
    assert done["status"] == "failed"
    assert step(done, "charge")["status"] == "failed"
    assert step(done, "receipt")["status"] == "cancelled"
    assert target.requests_to("/receipts/") == []
    assert "step.resolved" in [e["kind"] for e in done["events"]]


def test_with_an_idempotency_key_the_post_is_sent_again_with_the_same_header(
    client: Api, workers: StartWorker, target: Target
) -> None:
    client.publish("pay", _charge_workflow(target, idempotency_key="{{ execution.id }}-charge"))
    target.script = lambda r: Reply(json={"id": "ch_3"} if r.path == "/charge" else {"ok": True})
    crashing = workers(FLOWFORGE_FAULTS="after_http_response=kill")
    eid = client.start("pay", {"amount": 30})
    wait_for(lambda: crashing.popen.poll() is not None, message="the armed worker to die")

    workers()
    done = client.wait(eid, timeout=30)
    assert done["status"] == "succeeded", done
    charges = target.requests_to("/charge")
    assert len(charges) == 2
    assert {r.headers["idempotency-key"] for r in charges} == {f"{eid}-charge"}
    assert [a["outcome"] for a in step(done, "charge")["attempts"]] == ["lost_lease", "succeeded"]
    assert step(done, "summary")["output"] == {"charge": "ch_3", "receipt": True}


def test_read_timeout_after_sending_is_unknown_then_resolve_succeeded_via_cli(
    client: Api, env: dict[str, str], workers: StartWorker, target: Target
) -> None:
    client.publish("pay", _charge_workflow(target, timeout_s=1))

    def slow_charge(r: Received) -> Reply:
        return (
            Reply(json={"id": "late"}, delay_s=3.0)
            if r.path == "/charge"
            else Reply(json={"ok": True})
        )

    target.script = slow_charge
    workers()
    eid = client.start("pay", {"amount": 40})
    execution = client.wait(eid, "needs_attention", timeout=30)
    _assert_unknown(execution)
    assert "no response" in step(execution, "charge")["attempts"][0]["error"]
    time.sleep(SETTLE_S)
    assert len(target.requests_to("/charge")) == 1

    result = cli(env, "resolve", eid, "charge", "succeeded", '{"body": {"id": "ch_4"}}')
    assert result.returncode == 0, result.stderr
    done = client.wait(eid, timeout=30)
    assert done["status"] == "succeeded", done
    assert [r.path for r in target.requests_to("/receipts/")] == ["/receipts/ch_4"]
