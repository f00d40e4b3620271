"""Input schemas (docs/contract.md#input-schema) through a real bin/api: a webhook whose body fails
the version's JSON Schema 2020-12 is a 422 listing every error's path and writes nothing; a
schema that could not work is refused at publish with its path; hostile bodies (deep
nesting, huge arrays) within the body limit are answered with a 4xx, bounded."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import requests

from tests.support.api import Api
from tests.support.definitions import transform, workflow

SCHEMA = {
    "type": "object",
    "required": ["order", "items"],
    "additionalProperties": False,
    "properties": {
        "order": {"type": "string", "pattern": "^A-[0-9]+$"},
        "items": {"type": "array", "maxItems": 50_000, "items": {"$ref": "#/$defs/item"}},
        "note": {"type": "string"},
    },
    "$defs": {
        "item": {
            "type": "object",
            "required": ["sku", "qty"],
            "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
        }
    },
}


def definition(schema: Any) -> dict[str, Any]:
    keep = transform("keep", {"order": "{{ input.order }}"})
    return workflow(keep, name="Checked orders", input_schema=schema)


def counts(db: psycopg.Connection) -> dict[str, int]:
    return {
        table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        for table in ("executions", "steps", "outbox", "idempotency_keys", "execution_events")
    }


def hook(api: str, body: Any, raw: bytes | None = None) -> requests.Response:
    return requests.post(
        f"{api}/hooks/orders",
        data=raw if raw is not None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": str(time.time_ns())},
        timeout=60,
    )


def test_webhooks_are_checked_against_the_input_schema(
    api: str, api_key: str, db: psycopg.Connection
) -> None:
    client = Api(api, api_key)
    client.publish("orders", definition(SCHEMA))
    version = client.session.get(f"{api}/api/v1/workflows/orders/versions/1", timeout=10).json()
    assert version["input_schema"] == SCHEMA

    good = {"order": "A-1", "items": [{"sku": "s", "qty": 2}]}
    accepted = hook(api, good)
    assert accepted.status_code == 202, accepted.text
    before = counts(db)

    bad = {"order": "B-1", "items": [{"sku": "s", "qty": 0}, {"qty": "2"}], "extra": True}
    r = hook(api, bad)
    assert r.status_code == 422, r.text
    assert r.headers["Content-Type"] == "application/problem+json"
    paths = sorted(error["path"] for error in r.json()["errors"])
    assert paths == ["$", "$.items[0].qty", "$.items[1]", "$.items[1].qty", "$.order"]
    # The answer names what the schema wanted, never what was sent.
    assert "B-1" not in r.text and '"2"' not in r.text
    assert hook(api, []).status_code == 422
    assert counts(db) == before

    # Hostile bodies within the 1 MiB body limit: too deep for jsonb (400, as without a
    # schema), wrong in thousands of places (422 with the first 100), too many values to
    # walk (413); each answered within seconds, never by a 500.
    deep = b'{"order": "A-1", "items": [], "note": ' + b"[" * 300 + b"]" * 300 + b"}"
    assert hook(api, None, deep).status_code == 400
    figures = {}
    for label, body, status in [
        ("3k wrong items", {"order": "A-1", "items": [{"sku": 1}] * 3_000}, 422),
        ("3k right items", {"order": "A-1", "items": [{"sku": "s", "qty": 1}] * 3_000}, 202),
        ("200k numbers", {"order": "A-1", "items": [1] * 200_000}, 413),
    ]:
        started = time.monotonic()
        r = hook(api, body)
        figures[label] = round(time.monotonic() - started, 3)
        assert r.status_code == status, (label, r.text[:300])
        if status == 422:
            assert len(r.json()["errors"]) == 100
            assert "more than 100" in r.json()["detail"]
    print("input schema answers (s):", figures)
    assert counts(db)["executions"] == before["executions"] + 1


def test_a_schema_that_cannot_work_is_refused_at_publish(api: str, api_key: str) -> None:
    client = Api(api, api_key)
    url = f"{api}/api/v1/workflows/orders/versions"
    cases = [
        ({"type": "strng"}, "$.input_schema.type"),
        ({"properties": {"a": {"minimum": "1"}}}, "$.input_schema.properties.a.minimum"),
        ({"$ref": "https://example.com/schema.json"}, "$.input_schema.$ref"),
        ({"items": {"$ref": "#/$defs/missing"}}, "$.input_schema.items.$ref"),
        ({"$defs": {"a": {"$id": "https://x.test/a"}}}, "$.input_schema.$defs.a.$id"),
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, "$.input_schema.$schema"),
        ("object", "$.input_schema"),
    ]
    for schema, path in cases:
        r = client.session.post(url, json=definition(schema), timeout=10)
        assert r.status_code == 422, (schema, r.text)
        assert path in [error["path"] for error in r.json()["errors"]], (schema, r.text)
    assert client.session.get(f"{api}/api/v1/workflows/orders", timeout=10).status_code == 404
    # A boolean schema and an anchored local reference are fine.
    client.publish("orders", definition(True))
    anchored = {"$defs": {"n": {"$anchor": "num", "type": "number"}}, "items": {"$ref": "#num"}}
    client.publish("orders", definition(anchored))
