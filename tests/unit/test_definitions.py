"""Definition validation: every rule of docs/contract.md#definition, each reported at its exact JSON
path."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flowforge.domain.definitions import (
    MAX_DEFINITION_BYTES,
    SAFE_METHODS,
    STEP_TYPES,
    Definition,
    DefinitionInvalid,
    RetryPolicy,
    parse_definition,
)
from flowforge.errors import FlowForgeError

SPEC_EXAMPLE: dict[str, Any] = {
    "name": "Order sync",
    "trigger": {"webhook": {"auth": "signature"}},
    "steps": [
        {
            "id": "lookup",
            "type": "http_request",
            "request": {
                "method": "GET",
                "url": "https://api.example.com/orders/{{ input.order_id }}",
                "timeout_s": 10,
            },
            "retry": {
                "max_attempts": 5,
                "initial_interval_s": 1,
                "backoff_coefficient": 2,
                "max_interval_s": 300,
            },
        },
        {"id": "cool_off", "type": "delay", "duration_s": 7200, "depends_on": ["lookup"]},
        {
            "id": "shape",
            "type": "transform",
            "depends_on": ["cool_off"],
            "output": {"order": "{{ lookup.body.id }}", "total": "{{ lookup.body.total }}"},
        },
        {
            "id": "notify",
            "type": "http_request",
            "depends_on": ["shape"],
            "when": {"path": "shape.total", "op": "gt", "value": 100},
            "request": {
                "method": "POST",
                "url": "https://hooks.example.com/orders",
                "json": "{{ shape }}",
                "headers": {"Authorization": "Bearer {{ secrets.hooks_token }}"},
                "idempotency_key": "{{ execution.id }}-notify",
            },
        },
    ],
}


def workflow(*steps: Any, **top: Any) -> dict[str, Any]:
    """Wrap steps in a minimal valid top level."""
    return {"name": "test", "steps": list(steps), **top}


def transform(step_id: str, *parents: str, output: Any = 1, **extra: Any) -> dict[str, Any]:
    """A transform step: the simplest node for graph and template tests."""
    step = {"id": step_id, "type": "transform", "output": output, **extra}
    if parents:
        step["depends_on"] = list(parents)
    return step


def http(step_id: str = "call", *parents: str, **request: Any) -> dict[str, Any]:
    """A valid GET step whose request fields a test can override."""
    step: dict[str, Any] = {
        "id": step_id,
        "type": "http_request",
        "request": {"method": "GET", "url": "https://x.example/", **request},
    }
    if parents:
        step["depends_on"] = list(parents)
    return step


def errors_of(doc: Any) -> list[dict[str, str]]:
    """The problems parse_definition reports, which must not be empty."""
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition(doc)
    assert caught.value.errors, "DefinitionInvalid must carry at least one error"
    return caught.value.errors


def only_error(doc: Any, path: str, fragment: str = "") -> str:
    """Assert the document has exactly one problem, at path, mentioning fragment."""
    errors = errors_of(doc)
    assert [error["path"] for error in errors] == [path], errors
    assert fragment in errors[0]["message"], errors
    return errors[0]["message"]


# --- the example of docs/contract.md#definition --------------------------------------------------


def test_the_spec_example_parses() -> None:
    definition = parse_definition(copy.deepcopy(SPEC_EXAMPLE))
    assert definition.name == "Order sync"
    assert definition.webhook_auth == "signature"
    assert [step.id for step in definition.steps] == ["lookup", "cool_off", "shape", "notify"]
    assert definition.roots() == ("lookup",)
    assert definition.children("lookup") == ("cool_off",)
    assert definition.children("notify") == ()
    assert definition.ancestors("notify") == {"lookup", "cool_off", "shape"}
    assert definition.ancestors("lookup") == frozenset()


def test_the_spec_example_steps_are_normalised() -> None:
    definition = parse_definition(copy.deepcopy(SPEC_EXAMPLE))
    lookup, cool_off, shape, notify = definition.steps
    assert lookup.retry == RetryPolicy(5, 1.0, 2.0, 300.0)
    assert lookup.request == {
        "method": "GET",
        "url": "https://api.example.com/orders/{{ input.order_id }}",
        "headers": {},
        "timeout_s": 10,
        "idempotency_key": None,
    }
    assert lookup.repeat_safe
    assert cool_off.duration_s == 7200
    assert cool_off.until is None
    assert cool_off.retry == RetryPolicy(max_attempts=1)
    assert shape.output == {"order": "{{ lookup.body.id }}", "total": "{{ lookup.body.total }}"}
    assert notify.when == {"path": "shape.total", "op": "gt", "value": 100}
    assert notify.request is not None
    assert notify.request["json"] == "{{ shape }}"
    assert "body" not in notify.request
    assert notify.request["timeout_s"] == 30
    assert notify.retry == RetryPolicy()
    assert notify.repeat_safe  # POST, but it carries an idempotency key
    assert definition.step("notify") is notify


def test_public_constants() -> None:
    assert STEP_TYPES == ("http_request", "delay", "transform", "wait", "map", "workflow")
    assert frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"}) == SAFE_METHODS
    assert MAX_DEFINITION_BYTES == 262_144
    assert issubclass(DefinitionInvalid, FlowForgeError)


def test_unknown_step_lookup_raises_key_error() -> None:
    with pytest.raises(KeyError):
        parse_definition(workflow(transform("a"))).step("b")


# --- graph --------------------------------------------------------------------------------------


def test_topological_order_is_stable_among_ready_steps() -> None:
    doc = workflow(transform("late", "early"), transform("early"), transform("other"))
    definition = parse_definition(doc)
    assert [step.id for step in definition.steps] == ["early", "late", "other"]
    assert definition.roots() == ("early", "other")


def test_diamond_graph() -> None:
    doc = workflow(
        transform("join", "left", "right"),
        transform("right", "start"),
        transform("left", "start"),
        transform("start"),
    )
    definition = parse_definition(doc)
    assert [step.id for step in definition.steps] == ["start", "right", "left", "join"]
    assert definition.children("start") == ("right", "left")
    assert definition.ancestors("join") == {"start", "left", "right"}
    assert definition.step("join").depends_on == ("left", "right")


def test_cycle_is_named() -> None:
    doc = workflow(transform("a", "c"), transform("b", "a"), transform("c", "b"), transform("d"))
    message = only_error(doc, "$.steps[0].depends_on")
    assert message == "cycle: a -> c -> b -> a"


def test_each_cycle_is_reported_once() -> None:
    doc = workflow(
        transform("down", "x"),
        transform("x", "y"),
        transform("y", "x"),
        transform("p", "q"),
        transform("q", "p"),
    )
    errors = errors_of(doc)
    assert errors == [
        {"path": "$.steps[1].depends_on", "message": "cycle: x -> y -> x"},
        {"path": "$.steps[3].depends_on", "message": "cycle: p -> q -> p"},
    ]


def test_self_dependency() -> None:
    only_error(workflow(transform("a", "a")), "$.steps[0].depends_on[0]", "itself")


def test_unknown_dependency() -> None:
    only_error(
        workflow(transform("a"), transform("b", "a", "zz")), "$.steps[1].depends_on[1]", "zz"
    )


def test_non_string_dependency() -> None:
    doc = workflow(transform("a"), {"id": "b", "type": "delay", "duration_s": 1, "depends_on": [1]})
    only_error(doc, "$.steps[1].depends_on[0]", "not the id of a step")


def test_duplicate_dependency() -> None:
    only_error(
        workflow(transform("a"), transform("b", "a", "a")), "$.steps[1].depends_on[1]", "twice"
    )


def test_depends_on_must_be_a_list() -> None:
    doc = workflow(transform("a"), {"id": "b", "type": "transform", "output": 1, "depends_on": "a"})
    only_error(doc, "$.steps[1].depends_on", "array")


def test_too_many_parents() -> None:
    parents = [f"p{i}" for i in range(21)]
    doc = workflow(*[transform(p) for p in parents], transform("child", *parents))
    only_error(doc, "$.steps[21].depends_on", "limit of 20")
    twenty = workflow(*[transform(p) for p in parents[:20]], transform("child", *parents[:20]))
    assert len(parse_definition(twenty).ancestors("child")) == 20


# --- top level ----------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", [[], "x", None, 1])
def test_top_level_must_be_an_object(doc: Any) -> None:
    only_error(doc, "$", "object")


@pytest.mark.parametrize("name", [None, "", "  ", 5])
def test_name_is_required(name: Any) -> None:
    only_error({"name": name, "steps": [transform("a")]}, "$.name", "name")


def test_name_length() -> None:
    only_error(workflow(transform("a"), name="n" * 201), "$.name", "200")
    assert parse_definition(workflow(transform("a"), name="n" * 200)).name == "n" * 200


@pytest.mark.parametrize("steps", [None, [], {}, "a"])
def test_steps_must_be_a_non_empty_list(steps: Any) -> None:
    only_error({"name": "t", "steps": steps}, "$.steps", "non-empty array")


def test_unknown_top_level_key() -> None:
    only_error(workflow(transform("a"), version=3), "$.version", "unknown key")


def test_description_is_allowed_and_must_be_a_string() -> None:
    parse_definition(workflow(transform("a"), description="syncs orders"))
    only_error(workflow(transform("a"), description=["x"]), "$.description", "string")


def test_trigger_defaults_to_signature() -> None:
    assert parse_definition(workflow(transform("a"))).webhook_auth == "signature"
    trigger: dict[str, Any] = {"webhook": {}}
    assert parse_definition(workflow(transform("a"), trigger=trigger)).webhook_auth == "signature"
    trigger = {"webhook": {"auth": "none"}}
    assert parse_definition(workflow(transform("a"), trigger=trigger)).webhook_auth == "none"


@pytest.mark.parametrize(
    ("trigger", "path"),
    [
        ({"webhook": {"auth": "basic"}}, "$.trigger.webhook.auth"),
        ({"webhook": {"auth": "none", "secret": "x"}}, "$.trigger.webhook.secret"),
        ({"webhook": {}, "cron": "* * * * *"}, "$.trigger.cron"),
        ({}, "$.trigger"),
        ("webhook", "$.trigger"),
    ],
)
def test_trigger_rules(trigger: Any, path: str) -> None:
    only_error(workflow(transform("a"), trigger=trigger), path)


# --- steps --------------------------------------------------------------------------------------


def test_a_step_must_be_an_object() -> None:
    only_error(workflow(transform("a"), "b"), "$.steps[1]", "object")


@pytest.mark.parametrize("step_id", [None, "", "1a", "a-b", "a.b", "é", "a" * 65, "a\n"])
def test_step_id_syntax(step_id: Any) -> None:
    only_error(workflow({"id": step_id, "type": "transform", "output": 1}), "$.steps[0].id", "id")


def test_longest_step_id() -> None:
    assert parse_definition(workflow(transform("_" + "a" * 63))).steps[0].id == "_" + "a" * 63


@pytest.mark.parametrize("step_id", ["input", "execution", "secrets"])
def test_reserved_step_ids(step_id: str) -> None:
    only_error(workflow(transform(step_id)), "$.steps[0].id", "reserved")


def test_duplicate_id_is_reported_at_the_second_occurrence() -> None:
    doc = workflow(transform("a"), transform("b"), transform("a"))
    only_error(doc, "$.steps[2].id", "duplicate step id 'a' (first at $.steps[0])")


def test_unknown_type_is_one_error() -> None:
    doc = workflow({"id": "a", "type": "shell", "command": "rm -rf /", "cwd": "/"})
    only_error(doc, "$.steps[0].type", "http_request, delay, transform")


def test_missing_type() -> None:
    only_error(workflow({"id": "a", "output": 1}), "$.steps[0].type")


@pytest.mark.parametrize(
    ("step", "path"),
    [
        ({"id": "a", "type": "delay", "duration_s": 1, "output": 1}, "$.steps[0].output"),
        ({"id": "a", "type": "transform", "output": 1, "retry": {}}, "$.steps[0].retry"),
        ({**http("a"), "duration_s": 1}, "$.steps[0].duration_s"),
        ({"id": "a", "type": "transform", "output": 1, "name": "x"}, "$.steps[0].name"),
    ],
)
def test_unknown_keys_per_type(step: dict[str, Any], path: str) -> None:
    only_error(workflow(step), path, "unknown key")


# --- http_request -------------------------------------------------------------------------------


def test_request_is_required() -> None:
    only_error(workflow({"id": "a", "type": "http_request"}), "$.steps[0].request", "required")


def test_method_is_case_insensitive_and_defaults_to_get() -> None:
    step = parse_definition(workflow(http(method="patch"))).steps[0]
    assert step.request is not None
    assert step.request["method"] == "PATCH"
    assert not step.repeat_safe
    bare = {"id": "a", "type": "http_request", "request": {"url": "https://x/"}}
    request = parse_definition(workflow(bare)).steps[0].request
    assert request is not None
    assert request["method"] == "GET"


@pytest.mark.parametrize("method", ["CONNECT", "TRACE", "", 1, None])
def test_method_must_be_known(method: Any) -> None:
    only_error(workflow(http(method=method)), "$.steps[0].request.method", "GET")


@pytest.mark.parametrize(
    ("method", "key", "safe"),
    [
        ("GET", None, True),
        ("HEAD", None, True),
        ("OPTIONS", None, True),
        ("PUT", None, True),
        ("DELETE", None, True),
        ("POST", None, False),
        ("PATCH", None, False),
        ("POST", "order-{{ input.id }}", True),
        ("PATCH", "k", True),
    ],
)
def test_repeat_safe(method: str, key: str | None, safe: bool) -> None:
    extra = {} if key is None else {"idempotency_key": key}
    step = parse_definition(workflow(http(method=method, **extra))).steps[0]
    assert step.repeat_safe is safe


def test_url_is_required() -> None:
    step = {"id": "a", "type": "http_request", "request": {"method": "GET"}}
    only_error(workflow(step), "$.steps[0].request.url", "required")
    only_error(workflow(http(url=5)), "$.steps[0].request.url", "string")


def test_unknown_request_key() -> None:
    only_error(workflow(http(params={})), "$.steps[0].request.params", "unknown key")


@pytest.mark.parametrize(
    ("headers", "path", "fragment"),
    [
        ([], "$.steps[0].request.headers", "object"),
        ({"Bad Name": "x"}, "$.steps[0].request.headers.Bad Name", "RFC 7230"),
        ({"X(y)": "x"}, "$.steps[0].request.headers.X(y)", "RFC 7230"),
        ({"X-A": 1}, "$.steps[0].request.headers.X-A", "string"),
        ({"X-A": "a\r\nSet-Cookie: x"}, "$.steps[0].request.headers.X-A", "CR or LF"),
        ({"X-A": "a\nb"}, "$.steps[0].request.headers.X-A", "CR or LF"),
    ],
)
def test_headers(headers: Any, path: str, fragment: str) -> None:
    only_error(workflow(http(headers=headers)), path, fragment)


def test_valid_headers_are_kept() -> None:
    headers = {"X-Trace_Id!": "abc", "Accept": "application/json"}
    request = parse_definition(workflow(http(headers=headers))).steps[0].request
    assert request is not None
    assert request["headers"] == headers


def test_json_and_body_are_exclusive() -> None:
    only_error(workflow(http(json={}, body="x")), "$.steps[0].request", "at most one")


def test_body_must_be_a_string() -> None:
    only_error(workflow(http(body={"a": 1})), "$.steps[0].request.body", "string")


def test_json_may_be_any_json() -> None:
    request = parse_definition(workflow(http(json=None))).steps[0].request
    assert request is not None
    assert request["json"] is None


@pytest.mark.parametrize("timeout", [0, -1, 300.5, "10", True, None])
def test_timeout_bounds(timeout: Any) -> None:
    only_error(workflow(http(timeout_s=timeout)), "$.steps[0].request.timeout_s", "300")


def test_timeout_upper_bound_is_inclusive() -> None:
    request = parse_definition(workflow(http(timeout_s=300))).steps[0].request
    assert request is not None
    assert request["timeout_s"] == 300


@pytest.mark.parametrize("key", [1, "", None, ["k"]])
def test_idempotency_key_must_be_a_string(key: Any) -> None:
    only_error(workflow(http(idempotency_key=key)), "$.steps[0].request.idempotency_key")


@pytest.mark.parametrize(
    ("retry", "path"),
    [
        ("3", "$.steps[0].retry"),
        ({"attempts": 3}, "$.steps[0].retry.attempts"),
        ({"max_attempts": 0}, "$.steps[0].retry.max_attempts"),
        ({"max_attempts": 21}, "$.steps[0].retry.max_attempts"),
        ({"max_attempts": 2.0}, "$.steps[0].retry.max_attempts"),
        ({"max_attempts": True}, "$.steps[0].retry.max_attempts"),
        ({"initial_interval_s": 0}, "$.steps[0].retry.initial_interval_s"),
        (
            {"initial_interval_s": 3601, "max_interval_s": 4000},
            "$.steps[0].retry.initial_interval_s",
        ),
        ({"backoff_coefficient": 0.5}, "$.steps[0].retry.backoff_coefficient"),
        ({"backoff_coefficient": 11}, "$.steps[0].retry.backoff_coefficient"),
        ({"max_interval_s": 86_401}, "$.steps[0].retry.max_interval_s"),
        ({"initial_interval_s": 10, "max_interval_s": 5}, "$.steps[0].retry.max_interval_s"),
    ],
)
def test_retry_bounds(retry: Any, path: str) -> None:
    only_error(workflow({**http("a"), "retry": retry}), path)


def test_retry_edges_are_accepted() -> None:
    retry = {
        "max_attempts": 20,
        "initial_interval_s": 3600,
        "backoff_coefficient": 10,
        "max_interval_s": 86_400,
    }
    step = parse_definition(workflow({**http("a"), "retry": retry})).steps[0]
    assert step.retry == RetryPolicy(20, 3600, 10, 86_400)


# --- delay and transform ------------------------------------------------------------------------


def delay(**fields: Any) -> dict[str, Any]:
    """A delay step with the given wait fields."""
    return {"id": "wait", "type": "delay", **fields}


@pytest.mark.parametrize(
    "until",
    ["2030-01-01T00:00:00+00:00", "2030-01-01T00:00:00Z", "2030-06-01 12:30:00.5-03:00"],
)
def test_until_accepts_aware_timestamps(until: str) -> None:
    step = parse_definition(workflow(delay(until=until))).steps[0]
    assert step.until == until
    assert step.duration_s is None


def test_until_accepts_a_template() -> None:
    assert parse_definition(workflow(delay(until="{{ input.at }}"))).steps[0].until == (
        "{{ input.at }}"
    )


@pytest.mark.parametrize(
    ("fields", "path", "fragment"),
    [
        ({}, "$.steps[0]", "exactly one"),
        ({"duration_s": 1, "until": "2030-01-01T00:00:00Z"}, "$.steps[0]", "exactly one"),
        ({"duration_s": -1}, "$.steps[0].duration_s", "31536000"),
        ({"duration_s": 31_536_001}, "$.steps[0].duration_s", "31536000"),
        ({"duration_s": True}, "$.steps[0].duration_s", "31536000"),
        ({"duration_s": "5"}, "$.steps[0].duration_s", "31536000"),
        ({"until": "2030-01-01T00:00:00"}, "$.steps[0].until", "timezone"),
        ({"until": "tomorrow"}, "$.steps[0].until", "ISO-8601"),
        ({"until": "294276-01-01T00:00:00Z"}, "$.steps[0].until", "ISO-8601"),
        ({"until": 1700000000}, "$.steps[0].until", "ISO-8601"),
        ({"until": "{{ nope }}"}, "$.steps[0].until", "'nope'"),
        ({"until": "{{ input | date }}"}, "$.steps[0].until", "dotted path"),
    ],
)
def test_delay_rules(fields: dict[str, Any], path: str, fragment: str) -> None:
    only_error(workflow(delay(**fields)), path, fragment)


def test_delay_duration_edges() -> None:
    assert parse_definition(workflow(delay(duration_s=0))).steps[0].duration_s == 0
    assert parse_definition(workflow(delay(duration_s=31_536_000))).steps[0].duration_s


def test_transform_output_is_required() -> None:
    only_error(workflow({"id": "a", "type": "transform"}), "$.steps[0].output", "required")


def test_transform_output_may_be_null() -> None:
    assert parse_definition(workflow(transform("a", output=None))).steps[0].output is None


# --- when ---------------------------------------------------------------------------------------


def test_when_with_exists_needs_no_value() -> None:
    when = {"path": "input.flag", "op": "exists"}
    assert parse_definition(workflow(transform("a", when=when))).steps[0].when == when


@pytest.mark.parametrize(
    ("when", "path", "fragment"),
    [
        ("input.x", "$.steps[1].when", "object"),
        ({"path": "{{ input.x }}", "op": "exists"}, "$.steps[1].when.path", "dotted path"),
        ({"path": "input.__class__", "op": "exists"}, "$.steps[1].when.path", "dotted path"),
        ({"op": "exists"}, "$.steps[1].when.path", "required"),
        ({"path": "input.x", "op": "matches", "value": "x"}, "$.steps[1].when.op", "one of"),
        ({"path": "input.x", "op": "eq"}, "$.steps[1].when.value", "required"),
        ({"path": "input.x", "op": "in", "value": "abc"}, "$.steps[1].when.value", "array"),
        ({"path": "input.x", "op": "gt", "value": True}, "$.steps[1].when.value", "number"),
        ({"path": "input.x", "op": "lte", "value": [1]}, "$.steps[1].when.value", "number"),
        ({"path": "input.x", "op": "eq", "value": 1, "else": 2}, "$.steps[1].when.else", "unknown"),
        ({"path": "secrets.token", "op": "exists"}, "$.steps[1].when.path", "secrets may only"),
        ({"path": "b.total", "op": "gt", "value": 1}, "$.steps[1].when.path", "'b'"),
        ({"path": "later.x", "op": "exists"}, "$.steps[1].when.path", "'later'"),
        ({"path": "execution.foo", "op": "exists"}, "$.steps[1].when.path", "execution"),
    ],
)
def test_when_rules(when: Any, path: str, fragment: str) -> None:
    doc = workflow(transform("a"), transform("b", "a", when=when), transform("later", "b"))
    only_error(doc, path, fragment)


@pytest.mark.parametrize(
    "when",
    [
        {"path": "a.total", "op": "gt", "value": 100},
        {"path": "a.name", "op": "lt", "value": "m"},
        {"path": "input.kind", "op": "in", "value": ["a", "b"]},
        {"path": "execution.version", "op": "ne", "value": None},
        {"path": "input", "op": "eq", "value": {"x": 1}},
    ],
)
def test_valid_when(when: dict[str, Any]) -> None:
    parse_definition(workflow(transform("a"), transform("b", "a", when=when)))


# --- templates ----------------------------------------------------------------------------------


def test_templates_may_read_transitive_ancestors_input_and_execution() -> None:
    output = {
        "a": "{{ a.x }}",
        "b": ["{{ b }}", "{{ input.deep.0.x }}"],
        "e": "{{ execution.id }}/{{ execution.workflow }}/{{ execution.version }}",
    }
    parse_definition(
        workflow(transform("a"), transform("b", "a"), transform("c", "b", output=output))
    )


@pytest.mark.parametrize(
    ("output", "path", "fragment"),
    [
        ({"x": "{{ sibling.v }}"}, "$.steps[2].output.x", "'sibling'"),
        ({"x": ["ok", "{{ c.v }}"]}, "$.steps[2].output.x[1]", "'c'"),
        ({"x": "{{ later }}"}, "$.steps[2].output.x", "'later'"),
        ({"x": "{{ nothing.v }}"}, "$.steps[2].output.x", "'nothing'"),
        ({"x": "{{ execution.secret }}"}, "$.steps[2].output.x", "execution has only"),
        ({"x": "{{ execution }}"}, "$.steps[2].output.x", "execution has only"),
        ({"x": "{{ execution.id.x }}"}, "$.steps[2].output.x", "execution has only"),
        ({"x": "{{ secrets.token }}"}, "$.steps[2].output.x", "outputs are stored"),
        ({"x": "{{ a | upper }}"}, "$.steps[2].output.x", "dotted path"),
        ({"x": "{{ ''.__class__ }}"}, "$.steps[2].output.x", "dotted path"),
        ({"x": "{{ a"}, "$.steps[2].output.x", "never closed"),
    ],
)
def test_template_rules(output: Any, path: str, fragment: str) -> None:
    doc = workflow(
        transform("a"),
        transform("sibling"),
        transform("c", "a", output=output),
        transform("later", "c"),
    )
    only_error(doc, path, fragment)


@pytest.mark.parametrize(
    "request_fields",
    [
        {"url": "https://x/{{ secrets.path }}"},
        {"headers": {"Authorization": "Bearer {{ secrets.token }}"}},
        {"json": {"k": ["{{ secrets.key }}"]}},
        {"body": "token={{ secrets.key }}"},
        {"idempotency_key": "{{ secrets.salt }}-1"},
    ],
)
def test_secrets_are_allowed_in_requests(request_fields: dict[str, Any]) -> None:
    parse_definition(workflow(http(**request_fields)))


@pytest.mark.parametrize(
    ("request_fields", "path"),
    [
        ({"url": "https://x/{{ secrets }}"}, "$.steps[0].request.url"),
        ({"json": "{{ secrets.a.b }}"}, "$.steps[0].request.json"),
    ],
)
def test_secrets_must_name_one_secret(request_fields: dict[str, Any], path: str) -> None:
    only_error(workflow(http(**request_fields)), path, "secrets.NAME")


def test_secrets_are_refused_in_until() -> None:
    only_error(workflow(delay(until="{{ secrets.at }}")), "$.steps[0].until", "outputs are stored")


@pytest.mark.parametrize(
    ("request_fields", "path"),
    [
        ({"url": "https://x/{{ other.id }}"}, "$.steps[0].request.url"),
        ({"headers": {"X-A": "{{ other.id }}"}}, "$.steps[0].request.headers.X-A"),
        ({"json": {"a": [{"b": "{{ other }}"}]}}, "$.steps[0].request.json.a[0].b"),
        ({"body": "{{ other.id }}"}, "$.steps[0].request.body"),
        ({"idempotency_key": "{{ other.id }}"}, "$.steps[0].request.idempotency_key"),
    ],
)
def test_request_templates_are_scoped(request_fields: dict[str, Any], path: str) -> None:
    only_error(workflow(http(**request_fields), transform("other")), path, "'other'")


def test_template_length_limit() -> None:
    ok = "{{ input.x }}" + "y" * (2048 - 13)
    assert len(ok) == 2048
    parse_definition(workflow(transform("a", output=ok)))
    only_error(workflow(transform("a", output=ok + "y")), "$.steps[0].output", "limit of 2048")


# --- limits -------------------------------------------------------------------------------------


def test_step_count_limit() -> None:
    parse_definition(workflow(*[transform(f"s{i}") for i in range(100)]))
    only_error(workflow(*[transform(f"s{i}") for i in range(101)]), "$.steps", "limit of 100")


def nested(levels: int) -> Any:
    """A string wrapped in that many arrays, to reach a chosen nesting depth."""
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


def test_nesting_depth_limit() -> None:
    # The document is depth 1, steps 2, the step 3: output adds 17 more levels to reach 20.
    parse_definition(workflow(transform("a", output=nested(17))))
    path = "$.steps[0].output" + "[0]" * 17
    only_error(workflow(transform("a", output=nested(18))), path, "depth 20")


def test_string_length_limit() -> None:
    parse_definition(workflow(transform("a", output="x" * 65_536)))
    only_error(workflow(transform("a", output="x" * 65_537)), "$.steps[0].output", "65536")


# --- several problems ---------------------------------------------------------------------------


def test_every_problem_is_reported() -> None:
    doc = {
        "name": "",
        "extra": True,
        "steps": [
            {"id": "a", "type": "http_request", "request": {"method": "FETCH", "url": 1}},
            {"id": "a", "type": "delay"},
            {"id": "b", "type": "transform", "depends_on": ["ghost"], "output": "{{ a.x }}"},
            {"id": "c", "type": "transform", "output": "{{ secrets.x }}", "when": {"op": "gt"}},
        ],
    }
    errors = errors_of(doc)
    assert sorted(error["path"] for error in errors) == sorted(
        [
            "$.extra",
            "$.name",
            "$.steps[1].id",
            "$.steps[2].depends_on[0]",
            "$.steps[0].request.method",
            "$.steps[0].request.url",
            "$.steps[1]",
            "$.steps[2].output",
            "$.steps[3].when.path",
            "$.steps[3].when.value",
            "$.steps[3].output",
        ]
    )


def test_the_exception_message_lists_the_problems() -> None:
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition({"name": "", "steps": [transform("a")]})
    assert str(caught.value) == "$.name: name is required: a non-empty string"
    assert caught.value.errors == [
        {"path": "$.name", "message": "name is required: a non-empty string"}
    ]


def test_parse_does_not_share_or_mutate_the_input() -> None:
    doc = copy.deepcopy(SPEC_EXAMPLE)
    parse_definition(doc)
    assert doc == SPEC_EXAMPLE


def test_definition_is_frozen() -> None:
    definition: Definition = parse_definition(workflow(transform("a")))
    with pytest.raises(AttributeError):
        definition.name = "x"  # type: ignore[misc]


def test_a_stored_version_using_a_secret_named_like_a_binding_still_loads() -> None:
    """`secret names may not end in _workflows` is newer than some published versions:
    those are parsed again by every worker and must not become unloadable."""
    doc = workflow(http(headers={"Authorization": "{{ secrets.api_workflows }}"}), name="old")
    with pytest.raises(DefinitionInvalid, match="_workflows"):
        parse_definition(copy.deepcopy(doc))
    assert parse_definition(copy.deepcopy(doc), stored=True).step("call").type == "http_request"


@pytest.mark.parametrize("auth", [{}, [], 1, None, True])
def test_a_webhook_auth_that_is_no_string_is_a_clear_error(auth: object) -> None:
    """Found by the API fuzzer: `{"auth": {}}` was an unhashable-type 500 at publish."""
    doc = {
        "name": "n",
        "trigger": {"webhook": {"auth": auth}},
        "steps": [{"id": "s", "type": "transform", "output": {}}],
    }
    with pytest.raises(DefinitionInvalid) as raised:
        parse_definition(doc)
    assert [e["path"] for e in raised.value.errors] == ["$.trigger.webhook.auth"]
