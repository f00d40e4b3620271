"""Approval forms (docs/contract.md#approvals): the declaration's subset of JSON Schema
checked at publish, and submissions checked against it, each problem by its JSON path."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flowforge.domain import definitions
from flowforge.domain.definitions import check_values, form_schema, from_html, may_decide

FORM: dict[str, Any] = {
    "title": "Approve refund",
    "fields": {
        "type": "object",
        "properties": {
            "amount": {"type": "number", "minimum": 0, "maximum": 500},
            "count": {"type": "integer", "minimum": 1},
            "reason": {"type": "string", "maxLength": 5},
            "plan": {"type": "string", "enum": ["a", "b"]},
            "channel": {"type": "string", "oneOf": [{"const": "card", "title": "Card"}]},
            "notify": {"type": "boolean", "title": "Tell them"},
        },
        "required": ["amount", "channel"],
    },
}


def _doc(form: Any, **step: Any) -> dict[str, Any]:
    wait = {"id": "approve", "type": "wait", "timeout_s": 60, "form": form, **step}
    return {"name": "refund", "steps": [wait]}


def _form() -> definitions.ApprovalForm:
    form = definitions.parse_definition(_doc(FORM, assignees=["alice"])).step("approve").form
    assert form is not None
    return form


def _errors(doc: Any) -> list[str]:
    with pytest.raises(definitions.DefinitionInvalid) as refused:
        definitions.parse_definition(doc)
    return [error["path"] for error in refused.value.errors]


def test_a_form_is_parsed_with_its_fields_choices_and_assignees() -> None:
    form = _form()
    assert form.assignees == ("alice",)
    by_name = {field.name: field for field in form.fields}
    assert by_name["channel"].choices == (("card", "Card"),)
    assert by_name["plan"].choices == (("a", "a"), ("b", "b"))
    assert by_name["amount"].required and not by_name["notify"].required
    assert form_schema(form)["fields"]["required"] == ["amount", "channel"]
    assert may_decide(form, "alice") and not may_decide(form, "bob")


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda f: f.pop("title"), "$.steps[0].form.title"),
        (lambda f: f.update(colour="red"), "$.steps[0].form.colour"),
        (lambda f: f["fields"].update(type="array"), "$.steps[0].form.fields.type"),
        (lambda f: f["fields"].update(properties={}), "$.steps[0].form.fields.properties"),
        (lambda f: f["fields"].update(required=[{}]), "$.steps[0].form.fields.required"),
        (
            lambda f: f["fields"]["properties"]["amount"].update(type="date"),
            "$.steps[0].form.fields.properties.amount.type",
        ),
        (
            lambda f: f["fields"]["properties"]["amount"].update(maximum=-1),
            "$.steps[0].form.fields.properties.amount",
        ),
        (
            lambda f: f["fields"]["properties"]["reason"].update(maxLength=0),
            "$.steps[0].form.fields.properties.reason.maxLength",
        ),
        (
            lambda f: f["fields"]["properties"]["reason"].update(format="email"),
            "$.steps[0].form.fields.properties.reason.format",
        ),
        (
            lambda f: f["fields"]["properties"]["plan"].update(enum=["a", "a"]),
            "$.steps[0].form.fields.properties.plan",
        ),
        (
            lambda f: f["fields"]["properties"]["plan"].update(oneOf=[]),
            "$.steps[0].form.fields.properties.plan",
        ),
        (
            lambda f: f["fields"]["properties"]["channel"]["oneOf"].append({"const": 1}),
            "$.steps[0].form.fields.properties.channel.oneOf[1]",
        ),
        (
            lambda f: f["fields"]["properties"].update({"a b": {"type": "boolean"}}),
            "$.steps[0].form.fields.properties.a b",
        ),
    ],
)
def test_a_bad_declaration_is_refused_at_its_path(change: Any, path: str) -> None:
    form = copy.deepcopy(FORM)
    change(form)
    assert path in _errors(_doc(form))


def test_assignees_need_a_form_and_are_names() -> None:
    plain = _doc(FORM, assignees=["alice"])
    del plain["steps"][0]["form"]
    assert _errors(plain) == ["$.steps[0].assignees"]
    assert _errors(_doc(FORM, assignees=["a", "a"])) == ["$.steps[0].assignees"]
    assert _errors(_doc(FORM, assignees=[""])) == ["$.steps[0].assignees[0]"]


def test_values_are_checked_field_by_field() -> None:
    form = _form()
    good = {"amount": 12.5, "count": 2, "reason": "ok", "plan": "a", "channel": "card"}
    assert check_values(form, good, "$.values") == []
    bad = {"amount": 501, "count": 1.5, "reason": "toolong", "plan": "c", "notify": "yes",
           "extra": 1}  # fmt: skip
    problems = {p["path"]: p["message"] for p in check_values(form, bad, "$.values")}
    assert set(problems) == {f"$.values.{name}" for name in
        ("amount", "count", "reason", "plan", "notify", "extra", "channel")}  # fmt: skip
    assert "toolong" not in " ".join(problems.values())  # the rule, never the value
    assert check_values(form, {"amount": True, "channel": "card"}, "$")[0]["path"] == "$.amount"
    assert check_values(form, [], "$") == [
        {"path": "$", "message": "the form's values must be a JSON object"}
    ]


def test_a_browser_form_is_read_as_json_values() -> None:
    form = _form()
    values, problems = from_html(
        form, {"amount": "7", "count": "3", "channel": "card", "notify": "true", "reason": ""}, "$"
    )
    assert values == {"amount": 7.0, "count": 3, "channel": "card", "notify": True}
    assert problems == []
    values, problems = from_html(form, {"amount": "x", "count": "1.5", "plan": "nan"}, "$")
    assert {p["path"] for p in problems} == {"$.amount", "$.count", "$.channel", "$.plan"}
    assert values["notify"] is False


def test_values_jsonb_or_a_float_cannot_hold_are_problems_not_crashes() -> None:
    # Valid JSON (an API body takes integers of up to 4300 digits) or a posted form that
    # PostgreSQL or the checks cannot hold: each is a field's problem, never a 500.
    form = _form()
    huge = 10**400
    for values in (
        {"amount": huge, "channel": "card"},
        {"amount": 1, "count": huge, "channel": "card"},
    ):
        problems = check_values(form, values, "$")
        assert [p["path"] for p in problems] in (["$.amount"], ["$.count"]), problems
    _, problems = from_html(form, {"amount": "1", "channel": "card", "count": "9" * 400}, "$")
    assert [p["path"] for p in problems] == ["$.count"]
    for text in ("a\x00b", "\ud800"):
        _, problems = from_html(form, {"amount": "1", "channel": "card", "reason": text}, "$")
        assert [p["path"] for p in problems] == ["$.reason"]


def test_a_bound_no_float_holds_is_refused_at_publish() -> None:
    doc = copy.deepcopy(FORM)
    doc["fields"]["properties"]["amount"]["maximum"] = 10**400
    with pytest.raises(definitions.DefinitionInvalid) as refused:
        definitions.parse_definition(_doc(doc))
    paths = [e["path"] for e in refused.value.errors]
    assert paths == ["$.steps[0].form.fields.properties.amount.maximum"], paths


def test_the_console_forms_own_names_are_no_field_names() -> None:
    # The console posts the CSRF token and the pressed button beside the fields: a field
    # named csrf would take the session's token as its value (stored in the output) and
    # one named decision the button's.
    for name in ("csrf", "decision"):
        doc = copy.deepcopy(FORM)
        doc["fields"]["properties"][name] = {"type": "string"}
        with pytest.raises(definitions.DefinitionInvalid) as refused:
            definitions.parse_definition(_doc(doc))
        paths = [e["path"] for e in refused.value.errors]
        assert paths == [f"$.steps[0].form.fields.properties.{name}"], paths


def test_an_approval_cannot_also_wait_for_an_event() -> None:
    # An event ends its wait with the event's payload, unchecked and decided by no one:
    # on an approval it would go around the form and the assignees.
    doc = _doc(FORM, assignees=["alice"], event="refund.approved", key="{{ input.order }}")
    with pytest.raises(definitions.DefinitionInvalid) as refused:
        definitions.parse_definition(doc)
    assert [e["path"] for e in refused.value.errors] == ["$.steps[0].event"]
