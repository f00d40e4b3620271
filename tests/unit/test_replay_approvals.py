"""Replay onto another version keeps the upstream steps' recorded outputs
(docs/contract.md#replay); an approval is kept only if the target version would have
asked the same people the same thing (docs/contract.md#approvals)."""

from __future__ import annotations

import copy
from typing import Any

from flowforge.domain import definitions
from flowforge.usecases.replay import upstream_differences

FORM: dict[str, Any] = {
    "title": "Approve refund",
    "fields": {"type": "object", "properties": {"amount": {"type": "number", "maximum": 500}}},
}


def _doc(**approval: Any) -> definitions.Definition:
    wait = {"id": "approve", "type": "wait", "timeout_s": 60, **approval}
    pay = {"id": "pay", "type": "transform", "depends_on": ["approve"], "output": {"a": 1}}
    return definitions.parse_definition({"name": "refund", "steps": [wait, pay]})


def test_a_wait_that_became_or_changed_an_approval_is_not_kept_by_a_replay() -> None:
    plain, approval = _doc(), _doc(form=FORM, assignees=["cfo"])
    other_people = _doc(form=FORM, assignees=["bob"])
    looser = copy.deepcopy(FORM)
    looser["fields"]["properties"]["amount"]["maximum"] = 10**6
    retitled = copy.deepcopy(FORM)
    retitled["title"] = "Approve the refund"
    changed = [
        (plain, approval),  # a machine's arbitrary resume kept as the cfo's approval
        (approval, plain),
        (approval, other_people),
        (approval, _doc(form=looser, assignees=["cfo"])),
    ]
    for original, target in changed:
        errors = upstream_differences(original, target, "pay")
        assert errors == [{"path": "$.steps.approve.form", "message": "another approval"}]
    # Words alone (titles, descriptions) ask the same thing of the same people.
    same = _doc(form=retitled, assignees=["cfo"])
    assert upstream_differences(approval, same, "pay") == []
    assert upstream_differences(plain, _doc(), "pay") == []
