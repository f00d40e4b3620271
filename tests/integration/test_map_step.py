"""The map step (docs/contract.md#map): items at most max_parallel at a time and results in
order, and a pause while items run, through real bin/api and bin/worker processes (steps run
at once); fail_fast, collect, and a retry that re-runs only the items that did not succeed in
the test's process (`in_process`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.api import Api, step
from tests.support.definitions import http, transform, workflow
from tests.support.inprocess import InProcess
from tests.support.processes import Process, wait_for
from tests.support.target import InFlight, Received, Reply, Target


@pytest.fixture
def client(api: str, api_key: str, workers: Callable[..., Process]) -> Api:
    workers(FLOWFORGE_WORKER_CONCURRENCY="8")
    return Api(api, api_key)


def holding(hold_s: float = 0.05, fail: Callable[[int], bool] = lambda _i: False) -> InFlight:
    """A target script that holds each request a moment and counts how many it holds at
    once; `fail(index)` says which items' requests answer 400."""

    def answer(request: Received) -> Reply:
        index = int(request.path.rsplit("/", 1)[1])
        if fail(index):
            return Reply(status=400, json={"error": "no stock"})
        return Reply(json={"reserved": index})

    return InFlight(hold_s, answer)


def orders(target: Target, **map_fields: Any) -> dict[str, Any]:
    reserve = http(
        "reserve",
        "POST",
        f"{target.url}/reserve/{{{{ index }}}}",
        json={"sku": "{{ item.sku }}", "order": "{{ input.order }}"},
        idempotency_key="{{ execution.id }}-{{ index }}",
    )
    got = {"sku": "{{ item.sku }}", "got": "{{ reserve.body.reserved }}"}
    lines = {"id": "lines", "type": "map", "items": "{{ input.lines }}", **map_fields}
    return workflow(
        {**lines, "steps": [reserve, transform("line", got, after=("reserve",))]},
        transform("total", "{{ lines }}", after=("lines",)),
        name="orders",
    )


def payload(count: int) -> dict[str, Any]:
    return {"order": "o-1", "lines": [{"sku": f"sku-{n}"} for n in range(count)]}


def test_items_run_at_most_max_parallel_at_once_and_the_output_keeps_their_order(
    client: Api, target: Target
) -> None:
    script = holding()
    target.script = script
    client.publish("orders", orders(target, max_parallel=3))
    eid = client.start("orders", payload(24))
    done = client.wait(eid, timeout=60)
    assert done["status"] == "succeeded", done
    expected = [{"sku": f"sku-{n}", "got": n} for n in range(24)]
    assert step(done, "lines")["output"] == expected
    assert step(done, "total")["output"] == expected
    assert 1 <= script.most <= 3
    sent = target.requests_to("/reserve/")
    assert sorted(int(r.path.rsplit("/", 1)[1]) for r in sent) == list(range(24))
    assert {r.headers["idempotency-key"] for r in sent} == {f"{eid}-{n}" for n in range(24)}
    # Item 0's request (items run in parallel: it need not arrive first).
    (first,) = [r for r in sent if r.path.endswith("/reserve/0")]
    assert first.json() == {"sku": "sku-0", "order": "o-1"}
    # One node on the page: the items are counted, not listed among the steps.
    assert [s["id"] for s in done["steps"]] == ["lines", "total"]
    items = step(done, "lines")["items"]
    assert items["total"] == 24 and items["counts"]["succeeded"] == 24
    page = client.session.get(
        f"{client.base}/api/v1/executions/{eid}/steps/lines/items",
        params={"after": 19, "limit": 3},
        timeout=10,
    ).json()
    assert [i["index"] for i in page["items"]] == [20, 21, 22]
    assert page["next_after"] == 22
    assert page["items"][0]["steps"][1]["output"] == {"sku": "sku-20", "got": 20}


def test_fail_fast_fails_the_map_at_the_first_failed_item_and_starts_no_more(
    in_process: InProcess, target: Target
) -> None:
    script = holding(fail=lambda index: index == 2)
    target.script = script
    in_process.publish("orders", orders(target, max_parallel=2))
    eid = in_process.start("orders", payload(40))
    done = in_process.wait(eid, timeout=60)
    assert done["status"] == "failed", done
    lines = step(done, "lines")
    assert lines["status"] == "failed"
    assert "item 2 failed" in lines["error"]
    assert step(done, "total")["status"] == "cancelled"
    assert len(target.requests_to("/reserve/")) <= 5
    assert lines["items"]["counts"]["queued"] >= 35


def test_collect_runs_every_item_then_a_retry_reruns_only_the_failed_ones(
    in_process: InProcess, target: Target
) -> None:
    failing = {3, 7, 11}
    target.script = holding(hold_s=0.01, fail=lambda index: index in failing)
    in_process.publish("orders", orders(target, max_parallel=4, on_item_failure="collect"))
    eid = in_process.start("orders", payload(16))
    done = in_process.wait(eid, timeout=60)
    assert done["status"] == "failed", done
    lines = step(done, "lines")
    assert "3 of 16 items did not succeed (first: item 3" in lines["error"]
    assert lines["items"]["counts"] == {
        "queued": 0,
        "running": 0,
        "succeeded": 13,
        "failed": 3,
        "unknown": 0,
        "cancelled": 0,
    }
    assert len(target.requests_to("/reserve/")) == 16
    failed_page = in_process.app.get(
        f"/api/v1/executions/{eid}/steps/lines/items", query_string={"status": "failed"}
    ).get_json()
    assert [i["index"] for i in failed_page["items"]] == [3, 7, 11]

    failing.clear()
    retried = in_process.post(f"/api/v1/executions/{eid}/retry")
    assert retried.status_code == 202, retried.text
    done = in_process.wait(eid, timeout=60)
    assert done["status"] == "succeeded", done
    sent = [int(r.path.rsplit("/", 1)[1]) for r in target.requests_to("/reserve/")]
    assert sorted(sent[16:]) == [3, 7, 11]
    assert [line["got"] for line in step(done, "lines")["output"]] == list(range(16))


def test_a_resume_does_not_run_again_an_item_that_failed_for_good(
    client: Api, target: Target
) -> None:
    """Soak seed 2344: a map's item failed (a 503 to its unsafe POST, no retry policy);
    with `collect` the map and its execution go on, so the workflow could be paused and
    resumed while the other items ran — and the resume re-ran every `failed` step, meant
    for the steps whose tries ran out under `on_exhausted: pause`: the item's unsafe POST
    was sent a second time, asked for by nobody."""
    release = threading.Event()

    def script(request: Received) -> Reply:
        index = int(request.path.rsplit("/", 1)[1])
        if index == 0:
            return Reply(status=503, json={"error": "busy"})
        if index == 1:
            release.wait(30)  # held until the execution has been paused and resumed
        return Reply(json={"reserved": index})

    target.script = script
    definition = orders(target, max_parallel=1, on_item_failure="collect")
    lines = definition["steps"][0]["steps"][0]["request"]
    del lines["idempotency_key"]  # an unsafe POST: never sent twice unless asked for
    client.publish("orders", definition)
    eid = client.start("orders", payload(3))
    # max_parallel 1: item 1 is sent only once item 0 has failed.
    wait_for(lambda: target.requests_to("/reserve/1"), timeout=30, message="item 1 sent")
    assert client.post(f"/api/v1/executions/{eid}/pause").status_code == 200
    assert client.post(f"/api/v1/executions/{eid}/resume").status_code == 200
    release.set()
    done = client.wait(eid, timeout=60)
    assert done["status"] == "failed", done
    assert "1 of 3 items did not succeed (first: item 0" in step(done, "lines")["error"]
    assert len(target.requests_to("/reserve/0")) == 1
