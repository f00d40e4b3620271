"""Validation has a bound no schema can lift (docs/reference/input-schema.md, security.md),
through a real bin/api: a catastrophic-backtracking `pattern` (also in patternProperties,
propertyNames and beside additionalProperties) costs linear time, because patterns run on
RE2; a pattern RE2 cannot run (backreferences, lookaround) is refused at publish, and so
is a `$ref` loop (`{"$ref": "#"}`, a `$defs` cycle, a `$dynamicRef` to itself), a 422
with its path instead of a 500 on every webhook."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from tests.support.api import Api

EVIL = r"^(\w+\s?)*$"
# 40 word characters and one that breaks the match: 2^40 backtracking paths in Python's re.
ATTACK = "a" * 40 + "!"
SCHEMAS = {
    "pattern": {"properties": {"name": {"type": "string", "pattern": EVIL}}},
    "pattern-properties": {"patternProperties": {EVIL: {"type": "integer"}}},
    "beside-additional": {"patternProperties": {EVIL: True}, "additionalProperties": False},
    "property-names": {"propertyNames": {"pattern": EVIL}},
}
# Each attack body and its answer: a name no pattern of patternProperties matches is
# simply not constrained by it (202).
BODIES = {
    "pattern": ({"name": ATTACK}, 422),
    "pattern-properties": ({ATTACK: "not an integer"}, 202),
    "beside-additional": ({ATTACK: 1}, 422),
    "property-names": ({ATTACK: 1}, 422),
}


def definition(schema: Any) -> dict[str, Any]:
    return {
        "name": "checked",
        "trigger": {"webhook": {"auth": "none"}},
        "input_schema": schema,
        "steps": [{"id": "keep", "type": "transform", "output": {"n": 1}}],
    }


def hook(api: str, key: str, body: Any, timeout: float = 60) -> requests.Response:
    """A webhook with a fresh key, its body serialised by hand (the attack bodies are
    exact)."""
    return requests.post(
        f"{api}/hooks/{key}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": str(time.time_ns())},
        timeout=timeout,
    )


def test_a_backtracking_pattern_costs_linear_time_in_every_keyword(api: str, api_key: str) -> None:
    client = Api(api, api_key)
    for name, schema in SCHEMAS.items():
        client.publish(name, definition(schema))
    # Every attack at once, three of each (more than the API's processes), and the
    # health check answers beside them.
    with ThreadPoolExecutor(max_workers=13) as pool:
        attacks = {
            pool.submit(hook, api, n, BODIES[n][0]): BODIES[n][1] for n in SCHEMAS for _ in range(3)
        }
        health = pool.submit(requests.get, f"{api}/healthz", timeout=60)
        answers = [(a.result(), status) for a, status in attacks.items()]
    assert health.result().status_code == 200
    for answer, status in answers:
        assert answer.status_code == status, answer.text
        assert ATTACK not in answer.text  # the sender's value is never echoed
    # What matches still matches.
    assert hook(api, "pattern", {"name": "two words"}).status_code == 202
    assert hook(api, "pattern-properties", {"abc": 1}).status_code == 202
    assert hook(api, "beside-additional", {"abc": 1}).status_code == 202
    assert hook(api, "property-names", {"abc def": 1}).status_code == 202


def test_a_schema_validation_could_not_bound_is_refused_at_publish(api: str, api_key: str) -> None:
    client = Api(api, api_key)
    url = f"{api}/api/v1/workflows/loops/versions"
    cases = [
        ({"$ref": "#"}, "$.input_schema.$ref"),
        ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
         "$.input_schema.$defs.a.$ref"),
        ({"$dynamicAnchor": "n", "$dynamicRef": "#n"}, "$.input_schema.$dynamicRef"),
        ({"allOf": [{"$ref": "#/allOf/0"}]}, "$.input_schema.allOf[0].$ref"),
        ({"properties": {"a": {"pattern": r"(a)\1"}}}, "$.input_schema.properties.a.pattern"),
        ({"pattern": r"^(?=a)a$"}, "$.input_schema.pattern"),
        ({"patternProperties": {r"(?<!x)y": True}}, "$.input_schema.patternProperties"),
        ({"propertyNames": {"pattern": "("}}, "$.input_schema.propertyNames.pattern"),
        ({"patternProperties": {"a": True}, "unevaluatedProperties": False},
         "$.input_schema.unevaluatedProperties"),
        # Schemas where a walk over every key would look wrong: a property named like a
        # data keyword holds a schema, and a reference makes data a schema.
        ({"properties": {"enum": {"$ref": "https://x.test/s.json"}}},
         "$.input_schema.properties.enum.$ref"),
        ({"properties": {"default": {"$ref": "#"}}, "allOf": [{"$ref": "#/properties/default"}]},
         "$.input_schema.allOf[0].$ref"),
        ({"$ref": "#/x", "x": {"$ref": "https://x.test/s.json"}}, "$.input_schema.x.$ref"),
        ({"$ref": "#/x", "x": {"pattern": "(?=a)"}}, "$.input_schema.x.pattern"),
        ({"$ref": "#/enum", "enum": [1]}, "$.input_schema.$ref"),
    ]  # fmt: skip
    for schema, path in cases:
        r = client.session.post(url, json=definition(schema), timeout=10)
        assert r.status_code == 422, (schema, r.text)
        assert path in [error["path"] for error in r.json()["errors"]], (schema, r.text)
    assert client.session.get(f"{api}/api/v1/workflows/loops", timeout=10).status_code == 404
    # A recursive schema that descends into the body is fine: a tree of nodes.
    tree = {
        "$defs": {"node": {"type": "object", "properties": {"kids": {
            "type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node",
    }  # fmt: skip
    client.publish("loops", definition(tree))
    deep = {"kids": [{"kids": [{"kids": []}]}]}
    assert hook(api, "loops", deep).status_code == 202


def fan_out(levels: int) -> dict[str, Any]:
    """Each level applies the next one twice to the same value: 2^levels evaluations of
    one value, without a loop (a DAG of references)."""
    defs: dict[str, Any] = {f"l{levels}": {"type": "integer"}}
    for n in range(levels):
        nxt = {"$ref": f"#/$defs/l{n + 1}"}
        defs[f"l{n}"] = {"anyOf": [nxt, {"allOf": [nxt]}]}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


def test_a_schema_that_multiplies_its_work_per_value_answers_422_within_its_budget(
    api: str, api_key: str
) -> None:
    client = Api(api, api_key)
    client.publish("fanning", definition(fan_out(40)))
    r = hook(api, "fanning", "not an integer")
    assert r.status_code == 422, r.text
    assert "keyword evaluations" in r.json()["detail"]
    # The same shape a few levels deep is an ordinary schema.
    client.publish("fanning", definition(fan_out(4)))
    assert hook(api, "fanning", 7).status_code == 202
    assert hook(api, "fanning", "seven").status_code == 422
