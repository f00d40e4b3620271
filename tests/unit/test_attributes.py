"""Search attributes' rules (docs/contract.md#search-attributes): what a definition may
declare, what renders to a stored value, and what a filter may name."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.definitions import (
    MAX_ATTRIBUTE_CHARS,
    AttributeFilterInvalid,
    DefinitionInvalid,
    attribute_filter,
    attribute_value,
    parse_definition,
    render_attributes,
)


def _definition(attributes: Any) -> dict[str, Any]:
    return {
        "name": "orders",
        "steps": [{"id": "shape", "type": "transform", "output": {"x": 1}}],
        "attributes": attributes,
    }


def _problems(attributes: Any) -> list[tuple[str, str]]:
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition(_definition(attributes))
    return [(e["path"], e["message"]) for e in caught.value.errors]


def test_declared_attributes_render_from_input_as_text() -> None:
    definition = parse_definition(
        _definition(
            {
                "order_id": "{{ input.order_id }}",
                "customer": "c-{{ input.customer.id }}",
                "tags": "{{ input.tags }}",
                "flag": "{{ input.flag }}",
            }
        )
    )
    rendered = render_attributes(
        definition,
        {"order_id": 4711, "customer": {"id": 7}, "tags": ["a", 1], "flag": True},
    )
    assert rendered == {"order_id": "4711", "customer": "c-7", "tags": '["a",1]', "flag": "true"}


@pytest.mark.parametrize(
    "body",
    [
        {},  # missing
        {"order_id": None},
        {"order_id": ""},
        {"order_id": "x" * (MAX_ATTRIBUTE_CHARS + 1)},
        {"order_id": "a\x00b"},
        "not an object",
    ],
)
def test_a_value_that_cannot_be_stored_stores_nothing_and_never_raises(body: Any) -> None:
    definition = parse_definition(_definition({"order_id": "{{ input.order_id }}"}))
    assert render_attributes(definition, body) == {}


def test_a_value_of_the_maximum_length_is_kept() -> None:
    assert attribute_value("x" * MAX_ATTRIBUTE_CHARS) == "x" * MAX_ATTRIBUTE_CHARS


def test_a_version_without_attributes_declares_none() -> None:
    doc = _definition({})
    assert parse_definition(doc).attributes == ()
    del doc["attributes"]
    assert parse_definition(doc).attributes == ()


@pytest.mark.parametrize(
    ("attributes", "path", "says"),
    [
        ({"token": "{{ secrets.TOKEN }}"}, "$.attributes.token", "no secrets"),
        ({"step": "{{ shape.x }}"}, "$.attributes.step", "input only"),
        ({"id": "{{ execution.id }}"}, "$.attributes.id", "input only"),
        ({"fixed": "literal"}, "$.attributes.fixed", "needs a {{ input.PATH }}"),
        ({"Order": "{{ input.x }}"}, "$.attributes.Order", "lowercase"),
        ({"a" * 41: "{{ input.x }}"}, f"$.attributes.{'a' * 41}", "at most 40"),
        ({"n": 5}, "$.attributes.n", "a template"),
        ({"n": "{{ input.x"}, "$.attributes.n", "never closed"),
        (["order_id"], "$.attributes", "must be an object"),
        ({f"a{n}": "{{ input.x }}" for n in range(9)}, "$.attributes", "limit of 8"),
    ],
)
def test_bad_attributes_are_refused_at_publish_with_their_path(
    attributes: Any, path: str, says: str
) -> None:
    problems = _problems(attributes)
    assert [p for p, _ in problems] == [path]
    assert says in problems[0][1]


def test_a_filter_takes_valid_pairs_and_names_each_bad_one() -> None:
    assert attribute_filter([("attr.a", "a", "1"), ("attr.b_2", "b_2", "x y")]) == (
        ("a", "1"),
        ("b_2", "x y"),
    )
    with pytest.raises(AttributeFilterInvalid) as caught:
        attribute_filter(
            [
                ("attr.A", "A", "1"),
                ("attr.a", "a", ""),
                ("attr.b", "b", "1"),
                ("attr.b", "b", "2"),
                ("attr.c", "c", "x" * (MAX_ATTRIBUTE_CHARS + 1)),
            ]
        )
    assert caught.value.status == 422
    assert [e["path"] for e in caught.value.errors or []] == [
        "attr.A",
        "attr.a",
        "attr.b",
        "attr.c",
    ]
