"""Search attributes (docs/contract.md#search-attributes) through a real bin/api: the list's
`attr.NAME` filter over HTTP and the generated client, and `flowforge executions list
--where` and `cancel-bulk --where` as an operator runs them remotely (a subprocess with the
API's URL and a key, no database). One module, one API process, shared by its checks."""

from __future__ import annotations

import json

import requests

from flowforge.api.client import Client
from tests.integration.test_cli_remote import ok, remote
from tests.support.api import Api
from tests.support.definitions import transform, workflow

WAITER = workflow(
    {"id": "hold", "type": "wait", "timeout_s": 3600}, transform("done", {}, after=("hold",))
)
WAITER["attributes"] = {"order_id": "{{ input.order_id }}", "customer": "{{ input.customer }}"}


def test_the_api_the_client_and_the_cli_filter_by_attributes(client: Api, api_key: str) -> None:
    client.publish("orders", WAITER)
    mine = client.start("orders", {"order_id": 4711, "customer": "acme"})
    other = client.start("orders", {"order_id": 4712, "customer": "acme"})
    client.start("orders", {"order_id": 4713, "customer": "globex"})

    r = client.session.get(f"{client.base}/api/v1/executions?attr.order_id=4711", timeout=10)
    assert r.status_code == 200, r.text
    assert [item["id"] for item in r.json()["items"]] == [mine]
    bad = client.session.get(f"{client.base}/api/v1/executions?attr.Order=1", timeout=10)
    assert bad.status_code == 422
    assert bad.headers["Content-Type"].startswith("application/problem+json")
    assert [e["path"] for e in bad.json()["errors"]] == ["attr.Order"]
    assert client.execution(mine)["attributes"] == {"customer": "acme", "order_id": "4711"}

    generated = Client(client.base, api_key)
    page = generated.get_executions(attr={"customer": "acme"})
    assert [item["id"] for item in page["items"]] == [other, mine]

    listed = json.loads(
        ok(
            remote(
                client.base,
                api_key,
                "executions",
                "list",
                "--where",
                "order_id=4711",
                "--output",
                "json",
            )
        )
    )
    assert [item["id"] for item in listed["items"]] == [mine]
    both = json.loads(
        ok(
            remote(
                client.base,
                api_key,
                "executions",
                "list",
                "--where",
                "customer=acme",
                "--where",
                "order_id=4712",
                "--output",
                "json",
            )
        )
    )
    assert [item["id"] for item in both["items"]] == [other]
    shown = ok(remote(client.base, api_key, "executions", "show", mine))
    assert "attributes customer=acme  order_id=4711" in shown
    usage = remote(client.base, api_key, "executions", "list", "--where", "Order=1")
    assert usage.returncode == 2 and "lowercase letters" in usage.stderr

    cancelled = json.loads(
        ok(
            remote(
                client.base,
                api_key,
                "cancel-bulk",
                "--where",
                "customer=acme",
                "--yes",
                "--output",
                "json",
            )
        )
    )
    assert cancelled["done"] == 2 and cancelled["skipped"] == []
    statuses = {
        item["id"]: item["status"]
        for item in requests.get(
            f"{client.base}/api/v1/executions",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=10,
        ).json()["items"]
    }
    assert statuses[mine] == statuses[other] == "cancelled"
    assert sorted(statuses.values()).count("cancelled") == 2
