"""The template language: dotted paths only, typed when whole, text when embedded."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.templating import (
    TemplateError,
    TemplateSyntaxError,
    evaluate_condition,
    find_placeholders,
    is_path,
    iter_template_strings,
    render,
    render_url,
    resolve_path,
)
from flowforge.errors import FlowForgeError

CONTEXT: dict[str, Any] = {
    "input": {"order_id": "A/1 ?&", "n": 3, "price": 2.5, "ok": True, "none": None},
    "lookup": {"body": {"id": 7, "items": [{"id": "x"}, {"id": "y"}], "tags": ["a", "b"]}},
    "execution": {"id": "e-1", "workflow": "w", "version": 2},
}


def test_errors_belong_to_the_flowforge_root() -> None:
    assert issubclass(TemplateError, FlowForgeError)
    assert issubclass(TemplateSyntaxError, FlowForgeError)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ input.n }}", 3),
        ("{{input.n}}", 3),
        ("{{ input.price }}", 2.5),
        ("{{ input.ok }}", True),
        ("{{ input.none }}", None),
        ("{{ lookup.body.tags }}", ["a", "b"]),
        ("{{ lookup.body.items.1 }}", {"id": "y"}),
        ("{{\n  input.order_id\t}}", "A/1 ?&"),
    ],
)
def test_a_whole_placeholder_keeps_the_json_type(template: str, expected: Any) -> None:
    assert render(template, CONTEXT) == expected


def test_a_whole_placeholder_returns_the_context_object_itself() -> None:
    assert render("{{ lookup.body }}", CONTEXT) is CONTEXT["lookup"]["body"]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("n={{ input.n }}", "n=3"),
        ("p={{ input.price }}", "p=2.5"),
        ("{{ input.ok }}!", "true!"),
        ("[{{ input.none }}]", "[]"),
        ("s={{ input.order_id }}", "s=A/1 ?&"),
        ("{{ lookup.body.items.0 }};", '{"id":"x"};'),
        ("t={{ lookup.body.tags }}", 't=["a","b"]'),
        ("{{ input.n }}{{ input.n }}", "33"),
        (" {{ input.n }}", " 3"),
        ("plain text with { single } braces", "plain text with { single } braces"),
    ],
)
def test_embedded_placeholders_render_as_text(template: str, expected: str) -> None:
    assert render(template, CONTEXT) == expected


def test_render_walks_lists_and_dict_values_but_not_keys() -> None:
    value = {"{{ input.n }}": ["{{ input.n }}", 1, None, False, {"x": "id {{ lookup.body.id }}"}]}
    assert render(value, CONTEXT) == {"{{ input.n }}": [3, 1, None, False, {"x": "id 7"}]}


def test_render_url_encodes_embedded_values() -> None:
    url = "https://api.example.com/orders/{{ input.order_id }}?n={{ input.n }}"
    assert render_url(url, CONTEXT) == "https://api.example.com/orders/A%2F1%20%3F%26?n=3"


def test_render_url_takes_a_whole_placeholder_verbatim() -> None:
    context = {"input": {"url": "https://x.example/a b?c=d"}}
    assert render_url("{{ input.url }}", context) == "https://x.example/a b?c=d"


def test_render_url_whole_placeholder_must_be_a_string() -> None:
    with pytest.raises(TemplateError, match=r"input\.n.*must be a string, not a number"):
        render_url("{{ input.n }}", CONTEXT)


@pytest.mark.parametrize(
    ("dotted", "message"),
    [
        (
            "lookup.body.missing",
            r"\{\{ lookup.body.missing \}\}: 'missing' not found in lookup.body",
        ),
        ("nope", r"'nope' not found in the context"),
        ("lookup.body.items.5", r"index 5 out of range in lookup.body.items \(length 2\)"),
        ("lookup.body.items.first", r"lookup.body.items is an array, 'first' is no index"),
        ("lookup.body.id.x", r"lookup.body.id is a number, it has no 'x'"),
        ("input.none.x", r"input.none is a null, it has no 'x'"),
    ],
)
def test_a_missing_path_names_where_it_failed(dotted: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        resolve_path(CONTEXT, dotted)
    with pytest.raises(TemplateError, match=message):
        render(f"x {{{{ {dotted} }}}}", CONTEXT)


def test_resolve_path_indexes_lists() -> None:
    assert resolve_path(CONTEXT, "lookup.body.items.0.id") == "x"


def test_find_placeholders_lists_paths_in_order() -> None:
    text = "{{a}}-{{ b.c }}/{{ d-e.0.f_g }} {{ a }}"
    assert find_placeholders(text) == ["a", "b.c", "d-e.0.f_g", "a"]
    assert find_placeholders("no templates here") == []


@pytest.mark.parametrize(
    "text",
    [
        "{{ ''.__class__ }}",
        "{{ a.__class__ }}",
        "{{ __import__ }}",
        "{{ a | upper }}",
        "{{ a.b() }}",
        "{{ }}",
        "{{}}",
        "{{ a",
        "x {{ a }} {{ b",
        "{{ a + b }}",
        "{{ a..b }}",
        "{{ .a }}",
        "{{ a b }}",
        "{{ a['b'] }}",
        "{{{ a }}",
    ],
)
def test_anything_but_a_dotted_path_is_a_syntax_error(text: str) -> None:
    with pytest.raises(TemplateSyntaxError):
        find_placeholders(text)
    with pytest.raises(TemplateError):
        render(text, CONTEXT)


def test_syntax_errors_say_what_is_wrong() -> None:
    with pytest.raises(TemplateSyntaxError, match="only a dotted path"):
        find_placeholders("{{ a | upper }}")
    with pytest.raises(TemplateSyntaxError, match="never closed"):
        find_placeholders("{{ a")


def test_a_lone_closing_pair_is_text_so_literal_json_bodies_work() -> None:
    assert find_placeholders('{"a":{"b":1}}') == []
    assert render('{"a":{"b":"{{ x }}"}}', {"x": 1}) == '{"a":{"b":"1"}}'


def test_is_path() -> None:
    assert is_path("shape.total")
    assert is_path("items.0.id")
    assert not is_path("{{ shape }}")
    assert not is_path("a.__class__")
    assert not is_path("")


def test_iter_template_strings_yields_json_paths() -> None:
    value = {
        "steps": [
            {"id": "a"},
            {"request": {"url": "https://x/{{ input.id }}", "n": 1, "h": ["ok", "bad }}"]}},
        ]
    }
    assert list(iter_template_strings(value)) == [
        ("$.steps[1].request.url", "https://x/{{ input.id }}"),
        ("$.steps[1].request.h[1]", "bad }}"),
    ]
    assert list(iter_template_strings("{{ a }}", "$.x")) == [("$.x", "{{ a }}")]


def when(op: str, value: Any = None, path: str = "ctx.v") -> dict[str, Any]:
    """A condition as a definition would hold it."""
    return {"path": path, "op": op, "value": value}


def check(op: str, actual: Any, value: Any) -> bool:
    """Evaluate op with the resolved value actual against value."""
    return evaluate_condition(when(op, value), {"ctx": {"v": actual}})


def test_exists_is_true_only_when_the_path_resolves() -> None:
    assert evaluate_condition({"path": "lookup.body.id", "op": "exists"}, CONTEXT)
    assert evaluate_condition({"path": "input.none", "op": "exists"}, CONTEXT)
    assert not evaluate_condition({"path": "lookup.body.nope", "op": "exists"}, CONTEXT)
    assert not evaluate_condition({"path": "lookup.body.id.x", "op": "exists"}, CONTEXT)


@pytest.mark.parametrize("op", ["eq", "ne", "gt", "gte", "lt", "lte", "in"])
def test_a_missing_path_fails_every_other_op(op: str) -> None:
    with pytest.raises(TemplateError, match="'nope' not found"):
        evaluate_condition(when(op, [1], path="ctx.nope"), {"ctx": {}})


@pytest.mark.parametrize(
    ("op", "actual", "value", "expected"),
    [
        ("eq", 1, 1, True),
        ("eq", 1, 1.0, True),
        ("eq", "a", "a", True),
        ("eq", None, None, True),
        ("eq", {"a": [1, True]}, {"a": [1, True]}, True),
        ("eq", 1, True, False),
        ("eq", True, 1, False),
        ("eq", 0, False, False),
        ("eq", [1], [True], False),
        ("eq", {"a": 1}, {"a": True}, False),
        ("eq", "1", 1, False),
        ("eq", None, 0, False),
        ("eq", True, True, True),
        ("ne", 1, 2, True),
        ("ne", 1, True, True),
        ("ne", "a", "a", False),
        ("gt", 101, 100, True),
        ("gt", 100, 100, False),
        ("gt", 100.5, 100, True),
        ("gte", 100, 100, True),
        ("gte", 99, 100, False),
        ("lt", 1, 2, True),
        ("lt", 2, 1, False),
        ("lte", 2, 2, True),
        ("lte", 3, 2, False),
        ("gt", "b", "a", True),
        ("lt", "a", "b", True),
        ("gt", True, 0, False),
        ("lt", 0, True, False),
        ("gte", True, True, False),
        ("gt", "5", 1, False),
        ("lt", 1, "5", False),
        ("gt", None, 1, False),
        ("lt", [1], 5, False),
        ("in", "b", ["a", "b"], True),
        ("in", "c", ["a", "b"], False),
        ("in", 1, [True], False),
        ("in", True, [1, True], True),
        ("in", 1, [1.0], True),
        ("in", {"a": 1}, [{"a": 1}], True),
    ],
)
def test_conditions(op: str, actual: Any, value: Any, expected: bool) -> None:
    assert check(op, actual, value) is expected
