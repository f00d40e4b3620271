"""trigger.webhook.debounce and .batch as the parser reads them (docs/contract.md#debounce-batch):
defaults, the key template's rules, and what a group key renders to."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.definitions import (
    DEFAULT_MAX_WAIT_WINDOWS,
    MAX_DEBOUNCE_WAIT_S,
    DefinitionInvalid,
    Grouping,
    parse_definition,
)
from flowforge.usecases import grouping

STEPS = [{"id": "a", "type": "transform", "output": 1}]


def parsed(webhook: dict[str, Any]) -> Grouping | None:
    doc = {"name": "t", "trigger": {"webhook": {"auth": "none", **webhook}}, "steps": STEPS}
    return parse_definition(doc).grouping


def test_max_wait_defaults_to_ten_windows_capped_at_the_maximum() -> None:
    assert parsed({"debounce": {"window_s": 30}}) == Grouping(
        "debounce", 30.0, None, max_wait_s=30.0 * DEFAULT_MAX_WAIT_WINDOWS
    )
    assert parsed({"debounce": {"window_s": 86_400}}).max_wait_s == MAX_DEBOUNCE_WAIT_S  # type: ignore[union-attr]


def test_a_batch_keeps_its_key_and_size_and_no_trigger_means_no_grouping() -> None:
    assert parsed({"batch": {"key": "{{ input.shop }}", "max_items": 5, "window_s": 2}}) == (
        Grouping("batch", 2.0, "{{ input.shop }}", max_items=5)
    )
    assert parsed({}) is None


@pytest.mark.parametrize("key", ["{{ secrets.token }}", "{{ steps.a.output }}", "", 5])
def test_a_key_reads_input_only(key: Any) -> None:
    with pytest.raises(DefinitionInvalid) as caught:
        parsed({"debounce": {"window_s": 1, "key": key}})
    assert [e["path"] for e in caught.value.errors] == ["$.trigger.webhook.debounce.key"]


def test_a_group_key_renders_strings_as_they_are_and_other_values_as_json() -> None:
    debounce = Grouping("debounce", 1.0, "{{ input.customer }}", max_wait_s=10.0)
    assert grouping.group_key(debounce, {"customer": "c1"}) == "c1"
    assert grouping.group_key(debounce, {"customer": {"id": 7}}) == '{"id":7}'
    assert grouping.group_key(Grouping("batch", 1.0, max_items=2), {"x": 1}) == ""
    with pytest.raises(grouping.KeyUnresolved):
        grouping.group_key(debounce, {"other": 1})
