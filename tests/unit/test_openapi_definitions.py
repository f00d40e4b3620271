"""/openapi.json's Definition schema accepts what flowforge/domain/definitions/ accepts.

The OpenAPI document is written by hand (it states the contract) and the parser is the
rule, so they drift apart unless a test holds them together: it once rejected
`concurrency`, `deadline_s`, `start_within_s` and `retention_days`, which the API took.
Each object of the format is compared both ways: the fields the parser allows (read from
its own "unknown key" answer, so a field added there shows up here) against the fields
the schema names; every field the schema names, with a sample value, accepted by both;
every enum value and every numeric or length bound answered alike; and every shipped
example and every literal definition in the test suite the parser accepts, accepted by
the schema. What a JSON Schema cannot say (the graph, template scopes, cross-field rules
such as a budget at least one attempt long) is left to the parser alone.
"""

from __future__ import annotations

import ast
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from flowforge.api import openapi
from flowforge.domain import definitions
from tests.support import definitions as shipped

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = openapi.DOCUMENT["components"]["schemas"]
VALIDATOR = jsonschema.Draft202012Validator(
    {"$ref": "#/components/schemas/Definition", "components": openapi.DOCUMENT["components"]}
)
PROBE = "zz_probe"

SHAPE = {"id": "shape", "type": "transform", "output": {}}
STEP_BASES: dict[str, dict[str, Any]] = {
    "http_request": {
        "id": "call",
        "type": "http_request",
        "request": {"url": "https://example.test/x"},
    },
    "delay": {"id": "pause", "type": "delay", "duration_s": 1},
    "transform": SHAPE,
    # With a form, so that its assignees may be set alone (they need one).
    "wait": {
        "id": "approve",
        "type": "wait",
        "timeout_s": 60,
        "form": {"title": "Approve", "fields": {"properties": {"ok": {"type": "boolean"}}}},
    },
    "map": {"id": "lines", "type": "map", "items": "{{ input.lines }}", "steps": [SHAPE]},
    "workflow": {"id": "invoice", "type": "workflow", "workflow": "invoicing"},
}


# A definition's outbound limits (docs/contract.md#outbound-limits), for the step that names one.
LIMITS = {"api": {"rate_per_s": 5}}


def _doc(*steps: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"name": "t", "steps": list(steps), **top}


def _step_schema(step_type: str) -> dict[str, Any]:
    """The Step variant whose `type` is this step type."""
    for ref in SCHEMAS["Step"]["oneOf"]:
        variant = SCHEMAS[ref["$ref"].rsplit("/", 1)[1]]
        if variant["properties"]["type"].get("const") == step_type:
            return dict(variant)
    raise AssertionError(f"no Step variant in openapi for step type {step_type!r}")


# Every object of the format: a smallest valid definition holding it, where it sits in
# that definition, and its schema in the OpenAPI document.
LOCATIONS: dict[str, tuple[dict[str, Any], list[str | int], dict[str, Any]]] = {
    "definition": (_doc(SHAPE), [], SCHEMAS["Definition"]),
    "trigger": (
        _doc(SHAPE, trigger={"webhook": {}}),
        ["trigger"],
        SCHEMAS["Definition"]["properties"]["trigger"],
    ),
    "trigger.webhook": (
        _doc(SHAPE, trigger={"webhook": {}}),
        ["trigger", "webhook"],
        SCHEMAS["Definition"]["properties"]["trigger"]["properties"]["webhook"],
    ),
    "trigger.webhook.debounce": (
        _doc(SHAPE, trigger={"webhook": {"debounce": {"window_s": 1}}}),
        ["trigger", "webhook", "debounce"],
        SCHEMAS["Debounce"],
    ),
    "trigger.webhook.batch": (
        _doc(SHAPE, trigger={"webhook": {"batch": {"window_s": 1, "max_items": 1}}}),
        ["trigger", "webhook", "batch"],
        SCHEMAS["Batch"],
    ),
    "trigger.schedule": (
        _doc(SHAPE, trigger={"schedule": {"every_s": 60}}),
        ["trigger", "schedule"],
        SCHEMAS["ScheduleDefinition"],
    ),
    "concurrency": (_doc(SHAPE, concurrency={"limit": 1}), ["concurrency"], SCHEMAS["Concurrency"]),
    **{
        f"step {step_type}": (
            _doc(
                STEP_BASES[step_type], **({"limits": LIMITS} if step_type == "http_request" else {})
            ),
            ["steps", 0],
            _step_schema(step_type),
        )
        for step_type in definitions.STEP_TYPES
    },
    "request": (_doc(STEP_BASES["http_request"]), ["steps", 0, "request"], SCHEMAS["Request"]),
    "retry": (
        # max_interval_s at its top, so that initial_interval_s may reach its own.
        _doc({**STEP_BASES["http_request"], "retry": {"max_interval_s": 86400}}),
        ["steps", 0, "retry"],
        SCHEMAS["Retry"],
    ),
    "limit": (_doc(SHAPE, limits=LIMITS), ["limits", "api"], SCHEMAS["Limit"]),
    "when": (
        _doc({**SHAPE, "when": {"path": "input.x", "op": "exists"}}),
        ["steps", 0, "when"],
        SCHEMAS["When"],
    ),
}

# A valid value for every field the schema names. A field named in the schema without a
# sample here fails test_every_named_field_is_accepted_by_both: add one.
SAMPLE_BATCH = {"max_items": 2, "window_s": 1}
SAMPLES: dict[str, dict[str, Any]] = {
    "definition": {
        "name": "Orders",
        "description": "what it does",
        "trigger": {"webhook": {"auth": "none"}},
        "steps": [SHAPE],
        "concurrency": {"limit": 2},
        "deadline_s": 60,
        "start_within_s": 30.5,
        "retention_days": 0.5,
        "archive_days": 7,
        "priority": "{{ input.priority }}",
        "attributes": {"order_id": "{{ input.order_id }}"},
        "limits": {"api": {"concurrency": 2}},
        "input_schema": {"type": "object"},
        "emits": {"event": "payment.settled", "key": "{{ input.data.object.id }}"},
    },
    "trigger": {"webhook": {"auth": "signature"}, "schedule": {"every_s": 60}},
    "trigger.webhook": {
        "auth": "none",
        "debounce": {"window_s": 30, "max_wait_s": 300},
        "batch": {"max_items": 100, "window_s": 10},
    },
    "trigger.webhook.debounce": {"key": "{{ input.customer }}", "window_s": 30, "max_wait_s": 300},
    "trigger.webhook.batch": {"key": "{{ input.shop }}", "max_items": 100, "window_s": 10},
    "trigger.schedule": {
        "cron": "*/5 * * * *",
        "every_s": 300,
        "timezone": "Europe/Lisbon",
        "overlap": "buffer_one",
        "catchup_window_s": 120,
        "jitter_s": 5,
        "input": {"region": "eu"},
    },
    "concurrency": {
        "limit": 3,
        "key": "{{ input.customer }}",
        "on_full": "drop_new",
        "max_queued": 10,
    },
    "step http_request": {
        "id": "call_two",
        "type": "http_request",
        "depends_on": [],
        "when": {"path": "input.x", "op": "exists"},
        "request": {"url": "https://example.test/y", "method": "POST"},
        "retry": {"max_attempts": 5},
        "budget_s": 120,
        "limit": "api",
    },
    "step delay": {
        "id": "later",
        "type": "delay",
        "depends_on": [],
        "when": {"path": "input.x", "op": "eq", "value": 1},
        "duration_s": 5,
        "until": "2030-01-01T00:00:00+00:00",
    },
    "step transform": {
        "id": "shape_two",
        "type": "transform",
        "depends_on": [],
        "when": {"path": "input.x", "op": "in", "value": [1, 2]},
        "output": {"x": "{{ input.x }}"},
    },
    "step wait": {
        "id": "approval",
        "type": "wait",
        "depends_on": [],
        "when": {"path": "input.x", "op": "gt", "value": 1},
        "timeout_s": 3600,
        "on_timeout": "continue",
        "auth": "signature",
        "form": {
            "title": "Approve",
            "fields": {"properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        },
        "assignees": ["alice"],
        "event": "payment.settled",
        "key": "{{ input.order_id }}",
        "from": "stripe-intake",
        "lookback_s": 600,
    },
    "step map": {
        "id": "each",
        "type": "map",
        "depends_on": [],
        "when": {"path": "input.x", "op": "exists"},
        "items": [1, 2, 3],
        "steps": [{"id": "double", "type": "transform", "output": {"n": "{{ item }}"}}],
        "max_parallel": 20,
        "on_item_failure": "collect",
    },
    "step workflow": {
        "id": "invoice",
        "type": "workflow",
        "depends_on": [],
        "when": {"path": "input.x", "op": "exists"},
        "workflow": "invoicing",
        "input": {"order": "{{ input.x }}"},
    },
    "request": {
        "method": "post",
        "url": "https://example.test/{{ input.x }}",
        "headers": {"X-Order": "{{ input.x }}"},
        "json": {"x": "{{ input.x }}"},
        "body": "raw",
        "timeout_s": 10,
        "idempotency_key": "{{ execution.id }}",
        "allow_templated_destination": True,
    },
    "retry": {
        "max_attempts": 4,
        "initial_interval_s": 2,
        "backoff_coefficient": 3,
        "max_interval_s": 600,
        "on_exhausted": "pause",
    },
    "limit": {
        "rate_per_s": 10,
        "burst": 20,
        "concurrency": 2,
        "circuit": {"failures": 3, "window_s": 60, "cool_down_s": 30},
        "max_hold_s": 120,
    },
    "when": {"path": "input.total", "op": "exists", "value": 1},
}
# Fields that exclude another: the sample drops that one from the location's base.
EXCLUDES = {
    ("trigger.schedule", "cron"): "every_s",
    ("step delay", "until"): "duration_s",
    # An approval waits for no event (docs/contract.md#approvals): the form goes.
    **{("step wait", name): "form" for name in ("event", "key", "from", "lookback_s")},
}
# Fields that need others (docs/contract.md#events): the sample adds them to the base.
_EVENT_WAIT = {"event": "payment.settled", "key": "{{ input.order_id }}"}
REQUIRES: dict[tuple[str, str], dict[str, Any]] = {
    **{("step wait", name): _EVENT_WAIT for name in ("event", "key", "from", "lookback_s")},
    ("definition", "emits"): {"trigger": {"webhook": {"auth": "signature"}}},
}


def _json_path(path: list[str | int]) -> str:
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)


def _at(doc: dict[str, Any], path: list[str | int]) -> Any:
    node: Any = doc
    for part in path:
        node = node[part]
    return node


def _with(location: str, field: str, value: Any) -> dict[str, Any]:
    """The location's base definition with one field of its object set to value."""
    base, path, _ = LOCATIONS[location]
    doc = copy.deepcopy(base)
    node = _at(doc, path)
    node.pop(EXCLUDES.get((location, field), ""), None)
    node.update(copy.deepcopy(REQUIRES.get((location, field), {})))
    node[field] = value
    return doc


def _parse_errors(doc: Any) -> list[dict[str, str]]:
    try:
        definitions.parse_definition(doc)
    except definitions.DefinitionInvalid as invalid:
        return invalid.errors
    return []


def _answers(doc: Any) -> tuple[bool, bool]:
    """(the parser accepts it, the OpenAPI schema accepts it)."""
    return not _parse_errors(doc), VALIDATOR.is_valid(doc)


def _fields() -> Iterator[tuple[str, str]]:
    for location, (_, _, schema) in LOCATIONS.items():
        for field in schema["properties"]:
            yield location, field


def _bound_cases() -> Iterator[tuple[str, str, Any, bool]]:
    """(location, field, value, whether it is inside) at each declared bound."""
    for location, field in _fields():
        prop = LOCATIONS[location][2]["properties"][field]
        if prop.get("type") in ("number", "integer"):
            if "minimum" in prop:
                yield location, field, prop["minimum"], True
                yield location, field, prop["minimum"] - 1, False
            if "exclusiveMinimum" in prop:
                yield location, field, prop["exclusiveMinimum"], False
            if "maximum" in prop:
                yield location, field, prop["maximum"], True
                yield location, field, prop["maximum"] + 1, False
            yield location, field, "1", False
        if prop.get("type") == "integer":
            yield location, field, prop.get("minimum", 1) + 0.5, False
        if prop.get("type") == "string":
            if "minLength" in prop:
                yield location, field, "x" * prop["minLength"], True
                yield location, field, "x" * (prop["minLength"] - 1), False
            if "maxLength" in prop:
                yield location, field, "x" * prop["maxLength"], True
                yield location, field, "x" * (prop["maxLength"] + 1), False


def _enum_cases() -> Iterator[tuple[str, str, Any]]:
    for location, field in _fields():
        for value in LOCATIONS[location][2]["properties"][field].get("enum", []):
            yield location, field, value


def test_the_document_is_valid_openapi_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(VALIDATOR.schema)


def test_step_variants_are_the_step_types() -> None:
    assert {step_type for step_type in openapi.STEP_SCHEMAS} == set(definitions.STEP_TYPES)
    for step_type in definitions.STEP_TYPES:
        assert _step_schema(step_type)["properties"]["type"] == {"const": step_type}


@pytest.mark.parametrize("location", LOCATIONS)
def test_each_base_is_accepted_by_both(location: str) -> None:
    base, _, _ = LOCATIONS[location]
    assert _parse_errors(base) == []
    assert VALIDATOR.is_valid(base), list(VALIDATOR.iter_errors(base))


@pytest.mark.parametrize("location", LOCATIONS)
def test_the_schema_names_exactly_the_fields_the_parser_allows(location: str) -> None:
    base, path, schema = LOCATIONS[location]
    doc = copy.deepcopy(base)
    _at(doc, path)[PROBE] = 1
    where = f"{_json_path(path)}.{PROBE}"
    [message] = [error["message"] for error in _parse_errors(doc) if error["path"] == where]
    allowed = set(message.split("allowed: ", 1)[1].split(", "))
    assert set(schema["properties"]) == allowed
    assert schema["additionalProperties"] is False
    assert not VALIDATOR.is_valid(doc)


@pytest.mark.parametrize(("location", "field"), list(_fields()))
def test_every_named_field_is_accepted_by_both(location: str, field: str) -> None:
    assert field in SAMPLES.get(location, {}), f"add a sample value for {location} {field}"
    doc = _with(location, field, SAMPLES[location][field])
    assert _parse_errors(doc) == []
    assert VALIDATOR.is_valid(doc), list(VALIDATOR.iter_errors(doc))


@pytest.mark.parametrize(("location", "field", "value"), list(_enum_cases()))
def test_every_enum_value_and_only_those_are_accepted_by_both(
    location: str, field: str, value: Any
) -> None:
    doc = _with(location, field, value)
    if (location, field) == ("when", "op"):
        _at(doc, LOCATIONS[location][1])["value"] = [1] if value == "in" else 1
    assert _answers(doc) == (True, True)
    assert _answers(_with(location, field, f"{value}-not")) == (False, False)


@pytest.mark.parametrize(("location", "field", "value", "inside"), list(_bound_cases()))
def test_every_bound_is_answered_alike(location: str, field: str, value: Any, inside: bool) -> None:
    assert _answers(_with(location, field, value)) == (inside, inside)


@pytest.mark.parametrize(
    ("priority", "accepted"),
    [
        (0, True),
        (definitions.MIN_PRIORITY, True),
        (definitions.MAX_PRIORITY, True),
        (definitions.MIN_PRIORITY - 1, False),
        (definitions.MAX_PRIORITY + 1, False),
        (2.5, False),
        (True, False),
        ("5", False),
        ("{{ input.priority }}", True),
        ("{{input.order.priority}}", True),
        ("{{ input }}", False),
        ("{{ secrets.p }}", False),
        ("{{ execution.id }}", False),
        ("x {{ input.priority }}", False),
        ("{{ input.a }}{{ input.b }}", False),
        (None, False),
    ],
)
def test_priority_values_are_answered_alike(priority: Any, accepted: bool) -> None:
    assert _answers(_doc(SHAPE, priority=priority)) == (accepted, accepted)


@pytest.mark.parametrize(
    ("when", "accepted"),
    [
        ({"path": "input.x", "op": "eq"}, False),
        ({"path": "input.x", "op": "in", "value": 1}, False),
        ({"path": "input.x", "op": "gt", "value": [1]}, False),
        ({"path": "input.x", "op": "lt", "value": "b"}, True),
        ({"path": "input.x", "op": "ne", "value": None}, True),
    ],
)
def test_when_values_are_answered_alike(when: dict[str, Any], accepted: bool) -> None:
    assert _answers(_doc({**SHAPE, "when": when})) == (accepted, accepted)


@pytest.mark.parametrize(
    "doc",
    [
        _doc(SHAPE, name=" "),
        _doc(SHAPE, trigger={}),
        _doc(SHAPE, trigger={"schedule": {"every_s": 60, "cron": "* * * * *"}}),
        _doc(SHAPE, trigger={"schedule": {}}),
        _doc({"id": "pause", "type": "delay"}),
        _doc({"id": "pause", "type": "delay", "duration_s": 1, "until": "2030-01-01T00:00:00Z"}),
        _doc({"id": "input", "type": "transform", "output": {}}),
        _doc({"id": "9x", "type": "transform", "output": {}}),
        _doc(SHAPE, {**SHAPE, "id": "b", "depends_on": ["shape", "shape"]}),
        _doc({**STEP_BASES["http_request"], "request": {"url": "u", "json": {}, "body": ""}}),
        _doc({**STEP_BASES["http_request"], "request": {"url": "u", "method": "FETCH"}}),
        _doc({**STEP_BASES["http_request"], "request": {"url": "u", "headers": {"a": "b\r\n"}}}),
        _doc({**STEP_BASES["http_request"], "request": {"url": "u", "headers": {"a": "b\n"}}}),
        _doc({**STEP_BASES["transform"], "duration_s": 1}),
        _doc({"id": "approve", "type": "wait"}),
        _doc({"id": "shape", "type": "map", "output": {}}),
        _doc({"id": "invoice", "type": "workflow"}),
        _doc({"id": "invoice", "type": "workflow", "workflow": "Not A Key"}),
        {"name": "t", "steps": []},
        {"steps": [SHAPE]},
        _doc(
            SHAPE,
            trigger={"webhook": {"debounce": {"window_s": 1}, "batch": SAMPLE_BATCH}},
        ),
    ],
)
def test_shapes_both_reject(doc: dict[str, Any]) -> None:
    assert _answers(doc) == (False, False)


class _NotLiteral(Exception):
    """A dict unpacked into another: its keys cannot be known without running the test."""


def _evaluate(node: ast.expr) -> Any:
    """A literal as written, with each name, call or f-string field standing for "1": a
    definition built around a fixture's URL or a variable is still a definition."""
    match node:
        case ast.Constant(value=value):
            return value
        case ast.Dict(keys=keys, values=values):
            if any(key is None for key in keys):
                raise _NotLiteral
            pairs = zip(keys, values, strict=True)
            return {_evaluate(key): _evaluate(value) for key, value in pairs if key is not None}
        case ast.List(elts=items) | ast.Tuple(elts=items):
            return [_evaluate(item) for item in items]
        case ast.JoinedStr(values=parts):
            return "".join(str(_evaluate(part)) for part in parts)
        case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=int() | float() as value)):
            return -value
        case _:
            return "1"


def _harvested() -> Iterator[tuple[str, Any]]:
    """Every definition written out in tests/ (a dict with steps, or support.definitions.
    unsigned([...])), with where it was found."""
    for source in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            candidate: Any = None
            try:
                if isinstance(node, ast.Dict):
                    candidate = _evaluate(node)
                elif (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == "unsigned"
                    and node.args
                    and isinstance(steps := _evaluate(node.args[0]), list)
                ):
                    candidate = shipped.unsigned(steps)
            except (_NotLiteral, TypeError):
                continue
            if isinstance(candidate, dict) and isinstance(candidate.get("steps"), list):
                yield f"{source.relative_to(ROOT)}:{node.lineno}", candidate


def _shipped() -> Iterator[tuple[str, Any]]:
    for example in sorted((ROOT / "docs" / "examples").glob("*.json")):
        yield str(example.relative_to(ROOT)), json.loads(example.read_text())
    yield "tests/support/definitions.py OPEN", shipped.OPEN


def test_every_shipped_example_is_accepted_by_both() -> None:
    examples = list(_shipped())
    assert len(examples) >= 5
    for where, doc in examples:
        assert _parse_errors(doc) == [], where
        assert VALIDATOR.is_valid(doc), (where, list(VALIDATOR.iter_errors(doc)))


def test_every_literal_definition_the_tests_hold_that_the_parser_accepts_the_schema_accepts() -> (
    None
):
    accepted = [(where, doc) for where, doc in _harvested() if not _parse_errors(doc)]
    assert len(accepted) >= 40, "the harvest of tests/ found too few definitions"
    refused = [
        (where, [error.message for error in VALIDATOR.iter_errors(doc)])
        for where, doc in accepted
        if not VALIDATOR.is_valid(doc)
    ]
    assert refused == []
