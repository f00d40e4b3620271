"""bin/api and bin/worker as real processes, driven over HTTP only."""

from __future__ import annotations

import pytest

from tests.support.api import Api, step
from tests.support.definitions import http, transform, workflow
from tests.support.target import Target

# In the fast lane (bin/test --fast, docs/howto/develop.md).
pytestmark = pytest.mark.fast


def test_webhook_runs_a_workflow_to_completion(api, api_key, workers, target: Target) -> None:
    client = Api(api, api_key)
    workers()
    client.publish(
        "orders",
        workflow(
            http("lookup", "GET", f"{target.url}/orders/{{{{ input.order_id }}}}"),
            transform(
                "shape",
                {"order": "{{ lookup.body.ok }}", "id": "{{ input.order_id }}"},
                after=("lookup",),
            ),
            http(
                "notify",
                "POST",
                f"{target.url}/notify",
                after=("shape",),
                json="{{ shape }}",
                idempotency_key="{{ execution.id }}-notify",
            ),
            name="Order sync",
        ),
    )
    eid = client.start("orders", {"order_id": "A 1"})
    done = client.wait(eid)
    assert done["status"] == "succeeded", done
    assert step(done, "shape")["output"] == {"order": True, "id": "A 1"}
    assert [r.path for r in target.received] == ["/orders/A%201", "/notify"]
    notify = target.requests_to("/notify")[0]
    assert notify.json() == {"order": True, "id": "A 1"}
    assert notify.headers["idempotency-key"] == f"{eid}-notify"
    assert step(done, "lookup")["attempts"][0]["http_status"] == 200
    kinds = [e["kind"] for e in done["events"]]
    assert kinds[0] == "execution.queued" and kinds[-1] == "execution.succeeded"
