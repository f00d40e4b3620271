"""A skipped step's history names the condition that skipped it, so the timeline can say
why (`small_order ... skipped because when shape.total lte 100 is false`)."""

from __future__ import annotations

from flowforge.domain.engine import Run
from tests.unit.test_engine import make_run


def skip_reasons(run: Run) -> dict[str | None, str]:
    return {step: detail["reason"] for step, kind, detail in run.events if kind == "step.skipped"}


def test_a_false_when_and_an_all_skipped_parent_each_name_their_reason() -> None:
    run = make_run(
        [
            {"id": "shape", "type": "transform", "output": {"total": "{{ input.total }}"}},
            {
                "id": "big",
                "type": "transform",
                "depends_on": ["shape"],
                "when": {"path": "shape.total", "op": "gt", "value": 100},
                "output": "big",
            },
            {
                "id": "tag",
                "type": "transform",
                "depends_on": ["shape"],
                "when": {"path": "input.tag", "op": "exists"},
                "output": "tagged",
            },
            {"id": "after_big", "type": "transform", "depends_on": ["big"], "output": 1},
        ],
        {"total": 50},
    )
    run.advance()
    assert skip_reasons(run) == {
        "big": "when shape.total gt 100 is false",
        "tag": "when input.tag exists is false",
        "after_big": "every step it depends on was skipped",
    }
