"""Search attributes (docs/contract.md#search-attributes), in-process against a real
database: written with the execution by every intake that has some (plain and gated), none
for a version without them, filtered by the API's list, its bulk replay, the console's
search box and bulk page, shown on the detail; bad filters are 422 problems with their
parameter."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from flowforge.store import apikeys
from tests.support.definitions import transform, workflow

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
ORDERS = workflow(transform("shape", {"x": "{{ input.order_id }}"}), name="Orders")
ORDERS["attributes"] = {
    "order_id": "{{ input.order_id }}",
    "customer": "{{ input.customer.id }}",
}


def _publish(client: Any, key: str, definition: dict[str, Any]) -> None:
    r = client.post(f"/api/v1/workflows/{key}/versions", json=definition)
    assert r.status_code == 201, r.get_data(as_text=True)


def _start(client: Any, key: str, body: dict[str, Any]) -> str:
    r = client.post(f"/hooks/{key}", json=body)
    assert r.status_code == 202, r.get_data(as_text=True)
    return str(r.get_json()["execution_id"])


def _ids(client: Any, query: str) -> list[str]:
    r = client.get(f"/api/v1/executions?{query}")
    assert r.status_code == 200, r.get_data(as_text=True)
    return [item["id"] for item in r.get_json()["items"]]


def test_attributes_are_stored_at_intake_filtered_and_shown(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    _publish(app_client, "orders", ORDERS)
    gated = {**ORDERS, "concurrency": {"limit": 1, "key": "{{ input.customer.id }}"}}
    _publish(app_client, "gated", gated)
    _publish(app_client, "plain", workflow(transform("shape", {"x": 1}), name="Plain"))
    mine = _start(app_client, "orders", {"order_id": 4711, "customer": {"id": "c-1"}})
    other = _start(app_client, "orders", {"order_id": 4712, "customer": {"id": "c-1"}})
    # Missing, null and empty values store nothing; the intake is not refused.
    bare = _start(app_client, "orders", {"order_id": None, "customer": {"id": ""}})
    held = _start(app_client, "gated", {"order_id": "4711", "customer": {"id": "c-2"}})
    plain = _start(app_client, "plain", {"order_id": 4711})

    rows = db.execute(
        "SELECT execution_id::text, name, value FROM execution_attributes ORDER BY 1, 2"
    ).fetchall()
    assert sorted(rows) == sorted(
        [
            (mine, "customer", "c-1"),
            (mine, "order_id", "4711"),
            (other, "customer", "c-1"),
            (other, "order_id", "4712"),
            (held, "customer", "c-2"),
            (held, "order_id", "4711"),
        ]
    )
    assert bare not in {r[0] for r in rows} and plain not in {r[0] for r in rows}

    assert _ids(app_client, "attr.order_id=4711") == [held, mine]
    assert _ids(app_client, "attr.order_id=4711&workflow=orders") == [mine]
    assert _ids(app_client, "attr.order_id=4711&attr.customer=c-1") == [mine]
    assert _ids(app_client, "attr.customer=c-1&limit=1") == [other]
    assert _ids(app_client, "attr.order_id=4711&status=failed") == []
    assert _ids(app_client, "attr.order_id=4711&status=queued") == [held, mine]
    assert _ids(app_client, "attr.order_id=9999") == []
    page = app_client.get("/api/v1/executions?attr.customer=c-1&limit=1").get_json()
    assert _ids(app_client, f"attr.customer=c-1&cursor={page['next_cursor']}") == [mine]

    # A key scoped to workflows finds only theirs.
    scoped = apikeys.create(db, "gated only", workflows=["gated"])[1]
    seen = app_client.get(
        "/api/v1/executions?attr.order_id=4711", headers={"Authorization": f"Bearer {scoped}"}
    )
    assert [item["id"] for item in seen.get_json()["items"]] == [held]

    detail = app_client.get(f"/api/v1/executions/{mine}").get_json()
    assert detail["attributes"] == {"customer": "c-1", "order_id": "4711"}
    assert app_client.get(f"/api/v1/executions/{plain}").get_json()["attributes"] == {}

    # A replay takes its version's attributes from the original's input.
    assert app_client.post(f"/api/v1/executions/{mine}/cancel", json={}).status_code == 202
    replayed = app_client.post(f"/api/v1/executions/{mine}/replay", json={"from_step": "shape"})
    assert replayed.status_code in (200, 201), replayed.get_data(as_text=True)
    new = replayed.get_json()["execution_id"]
    assert app_client.get(f"/api/v1/executions/{new}").get_json()["attributes"] == {
        "customer": "c-1",
        "order_id": "4711",
    }
    assert _ids(app_client, "attr.order_id=4711&workflow=orders") == [new, mine]

    # A bulk replay takes the same filter (all of its attributes).
    for attributes, count in (
        ({"order_id": "4711"}, 1),  # its replay; the replayed original is left out
        ({"customer": "c-1"}, 2),
        ({"customer": "c-1", "order_id": "4712"}, 1),
        ({"customer": "c-2"}, 0),
    ):
        replay = app_client.post(
            "/api/v1/executions/replay",
            json={
                "filter": {"workflow": "orders", "attributes": attributes},
                "from_step": "shape",
                "dry_run": True,
            },
        )
        assert replay.status_code == 200, replay.get_data(as_text=True)
        assert replay.get_json()["count"] == count, attributes


def test_bad_filters_and_definitions_are_422_with_their_path(app_client: Any, api_key: str) -> None:
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    for query, path in (
        ("attr.Order-Id=1", "attr.Order-Id"),
        ("attr.order_id=", "attr.order_id"),
        ("attr.order_id=1&attr.order_id=2", "attr.order_id"),
        ("attr.=1", "attr."),
        ("attr.x=" + "9" * 201, "attr.x"),
    ):
        r = app_client.get(f"/api/v1/executions?{query}")
        assert r.status_code == 422, (query, r.get_data(as_text=True))
        problem = r.get_json()
        assert r.content_type.startswith("application/problem+json")
        assert [e["path"] for e in problem["errors"]] == [path], problem
    r = app_client.post(
        "/api/v1/executions/replay",
        json={"filter": {"workflow": "orders", "attributes": {"Bad": "1"}}, "from_step": "a"},
    )
    assert r.status_code == 422
    assert [e["path"] for e in r.get_json()["errors"]] == ["$.filter.attributes.Bad"]

    refused = {
        **ORDERS,
        "attributes": {
            "token": "{{ secrets.API_TOKEN }}",
            "step": "{{ shape.x }}",
            "Bad": "{{ input.x }}",
            "fixed": "literal",
        },
    }
    r = app_client.post("/api/v1/workflows/bad/versions", json=refused)
    assert r.status_code == 422
    paths = sorted(e["path"] for e in r.get_json()["errors"])
    assert paths == [
        "$.attributes.Bad",
        "$.attributes.fixed",
        "$.attributes.step",
        "$.attributes.token",
    ]
    many = {**ORDERS, "attributes": {f"a{n}": "{{ input.x }}" for n in range(9)}}
    r = app_client.post("/api/v1/workflows/bad/versions", json=many)
    assert r.status_code == 422
    assert [e["path"] for e in r.get_json()["errors"]] == ["$.attributes"]


def _sign_in(client: Any, key: str) -> str:
    page = client.get("/ui/signin")
    token = CSRF.search(page.get_data(as_text=True)).group(1)
    assert client.post("/ui/signin", data={"csrf": token, "api_key": key}).status_code == 303
    return token


def test_the_console_searches_by_attribute_and_bulk_takes_the_search(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    _publish(app_client, "orders", ORDERS)
    mine = _start(app_client, "orders", {"order_id": 4711, "customer": {"id": "c-1"}})
    other = _start(app_client, "orders", {"order_id": 4712, "customer": {"id": "c-1"}})
    app_client.environ_base.pop("HTTP_AUTHORIZATION")
    _sign_in(app_client, api_key)

    listing = app_client.get("/ui/executions?where=order_id%3D4711")
    assert listing.status_code == 200
    page = listing.get_data(as_text=True)
    assert mine in page and other not in page
    assert 'id="f-where"' in page and 'value="order_id=4711"' in page
    assert app_client.get("/ui/executions?where=Order%3D1").status_code == 400

    shown = app_client.get(f"/ui/executions/{mine}").get_data(as_text=True)
    assert 'id="attributes"' in shown and "order_id=4711" in shown

    preview = app_client.get("/ui/bulk?action=cancel&where=customer%3Dc-1")
    assert re.search(r'id="preview-count">(\d+)<', preview.get_data(as_text=True)).group(1) == "2"
    preview = app_client.get("/ui/bulk?action=cancel&where=order_id%3D4712")
    body = preview.get_data(as_text=True)
    assert re.search(r'id="preview-count">(\d+)<', body).group(1) == "1"
    assert 'name="where" value="order_id=4712"' in body


def test_a_child_workflow_takes_its_version_attributes_from_its_input(
    in_process: Any, db: psycopg.Connection
) -> None:
    child = workflow(transform("issue", {"n": "{{ input.order }}"}), name="Invoicing")
    child["attributes"] = {"order_id": "{{ input.order }}"}
    in_process.publish("invoicing", child)
    gated = {**child, "concurrency": {"limit": 1}}
    in_process.publish("gated-invoicing", gated)
    parent = workflow(
        {
            "id": "invoice",
            "type": "workflow",
            "workflow": "invoicing",
            "input": {"order": "{{ input.order }}"},
        },
        {
            "id": "gated",
            "type": "workflow",
            "workflow": "gated-invoicing",
            "input": {"order": "{{ input.order }}"},
        },
        name="Orders",
    )
    in_process.publish("orders", parent)
    eid = in_process.start("orders", {"order": "o-7"})
    done = in_process.wait(eid, timeout=30)
    assert done["status"] == "succeeded", done
    assert done["attributes"] == {}
    found = {
        link["workflow"]: in_process.execution(link["execution_id"])["attributes"]
        for link in done["children"]
    }
    assert found == {"invoicing": {"order_id": "o-7"}, "gated-invoicing": {"order_id": "o-7"}}
