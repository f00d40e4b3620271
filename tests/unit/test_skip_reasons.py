"""A skipped step's history names the condition that skipped it, so the timeline can say
why (`small_order ... skipped because when shape.total lte 100 is false`)."""

from __future__ import annotations

from flowforge.domain.engine import Run
from tests.support.definitions import transform
from tests.unit.test_engine import make_run


def skip_reasons(run: Run) -> dict[str | None, str]:
    return {step: detail["reason"] for step, kind, detail in run.events if kind == "step.skipped"}


def test_a_false_when_and_an_all_skipped_parent_each_name_their_reason() -> None:
    over_100 = {"path": "shape.total", "op": "gt", "value": 100}
    tagged = {"path": "input.tag", "op": "exists"}
    run = make_run(
        [
            transform("shape", {"total": "{{ input.total }}"}),
            transform("big", "big", after=("shape",), when=over_100),
            transform("tag", "tagged", after=("shape",), when=tagged),
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
