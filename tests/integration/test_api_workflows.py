"""Publishing, validating and reading workflows through the Flask app on real PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.support.definitions import unsigned
from tests.support.problems import assert_problem

# In the fast lane (bin/test --fast, docs/howto/develop.md).
pytestmark = pytest.mark.fast

CHAIN = unsigned(
    [
        {"id": "a", "type": "transform", "output": {"n": "{{ input.n }}"}},
        {"id": "b", "type": "transform", "depends_on": ["a"], "output": "{{ a.n }}"},
    ],
    name="Chain",
)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def publish(client: Any, key: str, workflow: str, definition: Any) -> Any:
    return client.post(f"/api/v1/workflows/{workflow}/versions", json=definition, headers=auth(key))


def test_publish_creates_consecutive_immutable_versions(app_client: Any, api_key: str) -> None:
    first = publish(app_client, api_key, "chain", CHAIN)
    assert first.status_code == 201
    assert first.get_json()["version"] == 1
    assert first.headers["Location"] == "/api/v1/workflows/chain/versions/1"
    changed = {**CHAIN, "name": "Chain v2"}
    assert publish(app_client, api_key, "chain", changed).get_json()["version"] == 2

    v1 = app_client.get("/api/v1/workflows/chain/versions/1", headers=auth(api_key)).get_json()
    assert v1["name"] == "Chain" and v1["definition"] == CHAIN
    shown = app_client.get("/api/v1/workflows/chain", headers=auth(api_key)).get_json()
    assert [v["version"] for v in shown["versions"]] == [1, 2]
    listed = app_client.get("/api/v1/workflows", headers=auth(api_key)).get_json()
    assert listed["items"][0]["latest_version"] == 2
    assert listed["items"][0]["name"] == "Chain v2"


def test_invalid_definition_lists_every_problem_with_its_path_and_stores_nothing(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    bad = {
        "name": "",
        "steps": [
            {"id": "a", "type": "transform", "depends_on": ["c"], "output": 1},
            {"id": "a", "type": "teleport"},
            {"id": "b", "type": "http_request", "request": {"method": "BREW"}},
            {"id": "c", "type": "transform", "depends_on": ["d"], "output": "{{ nope.x }}"},
            {"id": "d", "type": "transform", "depends_on": ["c"], "output": 1},
        ],
    }
    body = assert_problem(publish(app_client, api_key, "bad", bad), 422)
    paths = {e["path"] for e in body["errors"]}
    assert {
        "$.name",
        "$.steps[1].id",
        "$.steps[2].request.method",
        "$.steps[2].request.url",
    } <= paths
    messages = " ".join(e["message"] for e in body["errors"])
    assert "c -> d -> c" in messages or "d -> c -> d" in messages
    assert db.execute("SELECT count(*) FROM workflows").fetchone()[0] == 0


def test_limits_are_named_in_the_422(app_client: Any, api_key: str) -> None:
    many = {
        "name": "big",
        "steps": [{"id": f"s{i}", "type": "transform", "output": i} for i in range(101)],
    }
    body = assert_problem(publish(app_client, api_key, "big", many), 422)
    assert "100" in json.dumps(body["errors"])


def test_http_errors_are_problem_details(app_client: Any, api_key: str) -> None:
    assert_problem(app_client.get("/api/v1/workflows"), 401)
    assert_problem(app_client.get("/api/v1/workflows", headers=auth("ff_" + "0" * 64)), 401)
    assert_problem(app_client.get("/api/v1/workflows/missing", headers=auth(api_key)), 404)
    assert_problem(app_client.get("/api/v1/workflows/chain/versions/9", headers=auth(api_key)), 404)
    assert_problem(app_client.get("/nowhere"), 404)
    assert_problem(app_client.delete("/hooks/x"), 405)
    assert_problem(
        app_client.post(
            "/api/v1/workflows/x/versions",
            data="{not json",
            content_type="application/json",
            headers=auth(api_key),
        ),
        400,
    )
    assert_problem(
        app_client.post(
            "/api/v1/workflows/x/versions",
            data="name: x",
            content_type="text/yaml",
            headers=auth(api_key),
        ),
        415,
    )
    assert_problem(publish(app_client, api_key, "Bad Key!", CHAIN), 422)
    too_big = {"name": "x" * 70_000, "steps": []}
    assert_problem(publish(app_client, api_key, "huge", too_big), 413)
    assert_problem(app_client.get("/api/v1/executions/not-a-uuid", headers=auth(api_key)), 404)
    assert_problem(app_client.get("/api/v1/executions?limit=0", headers=auth(api_key)), 400)
    assert_problem(app_client.get("/api/v1/executions?cursor=zzz", headers=auth(api_key)), 400)


def test_health_and_readiness(app_client: Any) -> None:
    assert app_client.get("/healthz").get_json() == {"status": "ok"}
    assert app_client.get("/readyz").status_code == 200
    metrics = app_client.get("/metrics").get_data(as_text=True)
    assert "flowforge_outbox_backlog 0.0" in metrics
