"""Properties of the template engine and the definition validator over arbitrary JSON."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flowforge.domain.definitions import Definition, DefinitionInvalid, parse_definition
from flowforge.domain.templating import TemplateError, render

SETTINGS = settings(max_examples=200, deadline=None)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
segments = st.from_regex(r"[A-Za-z0-9_-]{1,6}", fullmatch=True).filter(
    lambda segment: not segment.startswith("__")
)
paths = st.lists(segments, min_size=1, max_size=3).map(".".join)
# Strings that look like templates: placeholders, stray braces and text mixed together.
template_pieces = st.one_of(
    paths.map(lambda path: f"{{{{ {path} }}}}"),
    st.sampled_from(["{{", "}}", "{", "}", " ", "|", "."]),
    st.text(max_size=5),
)
templates = st.lists(template_pieces, max_size=5).map("".join)
templated_values = st.recursive(
    scalars | templates,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
contexts = st.dictionaries(segments, json_values, max_size=4)


@SETTINGS
@given(templated_values, contexts)
def test_render_raises_only_template_errors(value: Any, context: dict[str, Any]) -> None:
    with contextlib.suppress(TemplateError):
        render(value, context)


@SETTINGS
@given(st.text(st.characters(exclude_characters="{}")), contexts)
def test_text_without_braces_renders_unchanged(text: str, context: dict[str, Any]) -> None:
    assert render(text, context) == text


@SETTINGS
@given(segments, json_values, st.sampled_from(["", " ", "  ", "\n"]))
def test_a_whole_placeholder_returns_the_context_object(name: str, value: Any, space: str) -> None:
    context = {name: value}
    assert render(f"{{{{{space}{name}{space}}}}}", context) is value


def definition_like(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Objects that use the definition's own vocabulary, so validation goes deep."""
    keys = st.sampled_from(
        [
            "name", "steps", "trigger", "webhook", "auth", "id", "type", "depends_on", "when",
            "request", "retry", "method", "url", "headers", "json", "body", "timeout_s",
            "idempotency_key", "duration_s", "until", "output", "path", "op", "value",
            "max_attempts", "initial_interval_s", "backoff_coefficient", "max_interval_s",
        ]
    )  # fmt: skip
    return st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=6)


definition_values = st.recursive(
    scalars
    | templates
    | st.sampled_from(["a", "b", "GET", "POST", "delay", "transform", "http_request", "gt"]),
    definition_like,
    max_leaves=30,
)


@SETTINGS
@given(json_values | definition_values)
def test_parse_definition_returns_or_reports(doc: Any) -> None:
    try:
        assert isinstance(parse_definition(doc), Definition)
    except DefinitionInvalid as invalid:
        assert invalid.errors
        assert all(set(error) == {"path", "message"} for error in invalid.errors)


step_ids = st.sampled_from(["a", "b", "c", "d", "e", "f"])
steps = st.fixed_dictionaries(
    {"id": step_ids, "type": st.just("transform"), "output": st.just(1)},
    optional={"depends_on": st.lists(step_ids, max_size=3)},
)


@SETTINGS
@given(st.lists(steps, min_size=1, max_size=6, unique_by=lambda step: step["id"]))
def test_parsed_graphs_put_parents_first(raw_steps: list[dict[str, Any]]) -> None:
    try:
        definition = parse_definition({"name": "p", "steps": raw_steps})
    except DefinitionInvalid as invalid:
        assert invalid.errors
        return
    seen: set[str] = set()
    for step in definition.steps:
        assert set(step.depends_on) <= seen
        assert definition.ancestors(step.id) <= seen
        seen.add(step.id)
