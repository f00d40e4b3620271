"""The workflow step's rules (docs/contract.md#child-workflows) in flowforge/domain/engine.py,
without a database: what starting a child asks the store to write, what the child's end does to the
step, and when a child wakes its parent."""

from __future__ import annotations

from typing import Any

from flowforge.domain.definitions import parse_definition
from flowforge.domain.engine import ChildState, ChildTarget, Run
from flowforge.domain.kinds.workflow import child_key
from tests.unit.test_engine import OPERATOR, make_run, statuses

CHILD = parse_definition(
    {"name": "child", "steps": [{"id": "x", "type": "transform", "output": 1}]}
)


def parent(**step: Any) -> Run:
    run = make_run(
        [
            {"id": "invoice", "type": "workflow", "workflow": "invoicing", **step},
            {
                "id": "after",
                "type": "transform",
                "depends_on": ["invoice"],
                "output": "{{ invoice }}",
            },
        ],
        {"order": "o-1"},
    )
    run.child_targets = {"invoicing": ChildTarget(3, 30, 2, CHILD)}
    run.new_id = lambda: "child-1"
    return run


def started(**step: Any) -> Run:
    run = parent(input={"order": "{{ input.order }}"}, **step)
    run.started()
    run.advance()
    return run


def test_a_workflow_step_starts_its_child_and_waits_holding_nothing() -> None:
    run = started()
    assert statuses(run) == {"invoice": "waiting", "after": "pending"}
    assert run.status == "waiting" and run.dispatch == []
    [start] = run.changes.child_starts
    assert start.execution_id == "child-1" and start.input == {"order": "o-1"}
    assert start.key == child_key(run.execution_id, "invoice", 0) and start.depth == 1
    assert run.steps["invoice"].output == {
        "execution_id": "child-1",
        "workflow": "invoicing",
        "version": 2,
    }


def test_the_childs_output_becomes_the_steps_and_the_run_goes_on() -> None:
    run = started()
    run.take_changes()
    run.children["invoice"] = ChildState("child-1", "succeeded", {"n": 1})
    run.advance()
    assert statuses(run) == {"invoice": "succeeded", "after": "succeeded"}
    assert run.steps["after"].output == {"n": 1}
    assert run.status == "succeeded"


def test_a_failed_child_fails_the_step_with_its_error() -> None:
    run = started()
    run.children["invoice"] = ChildState("child-1", "failed", error="post: HTTP 400")
    run.advance()
    assert run.status == "failed"
    assert (
        run.steps["invoice"].error == "child execution child-1 of invoicing failed: post: HTTP 400"
    )
    assert run.steps["after"].status == "cancelled"


def test_a_child_that_needs_attention_keeps_the_step_waiting_and_says_so() -> None:
    run = started()
    run.children["invoice"] = ChildState("child-1", "needs_attention")
    run.advance()
    assert run.status == "waiting" and run.steps["invoice"].status == "waiting"
    assert "child-1" in (run.steps["invoice"].error or "")
    run.children["invoice"] = ChildState("child-1", "running")
    run.advance()
    assert run.steps["invoice"].error is None


def test_a_child_of_an_earlier_round_is_not_taken() -> None:
    run = started()
    run.children["invoice"] = ChildState("child-0", "succeeded", {"old": True})
    run.advance()
    assert run.steps["invoice"].status == "waiting"


def test_cancelling_the_parent_cancels_its_live_child() -> None:
    run = started()
    run.take_changes()
    run.cancel(actor=OPERATOR)
    assert run.status == "cancelled"
    assert run.changes.child_cancels == ["child-1"]


def test_beyond_the_depth_bound_no_child_starts_and_the_step_fails() -> None:
    run = parent()
    run.depth, run.max_child_depth = 3, 3
    run.started()
    run.advance()
    assert run.changes.child_starts == []
    assert "FLOWFORGE_MAX_CHILD_DEPTH 3" in (run.steps["invoice"].error or "")
    assert run.status == "failed"


def test_a_missing_workflow_fails_the_step_saying_which() -> None:
    run = parent()
    run.child_targets = {"invoicing": None}
    run.started()
    run.advance()
    assert run.steps["invoice"].error == (
        "not started: workflow 'invoicing' does not exist or is archived"
    )


def test_a_child_that_ends_wakes_its_parent() -> None:
    run = make_run([{"id": "x", "type": "transform", "output": 1}])
    run.parent = ("parent-1", "invoice")
    run.started()
    run.advance()
    assert run.status == "succeeded"
    assert run.changes.wake_parent == ("parent-1", "invoice")


def limited(concurrency: dict[str, Any]) -> ChildTarget:
    definition = parse_definition(
        {
            "name": "limited",
            "concurrency": concurrency,
            "steps": [{"id": "x", "type": "transform", "output": 1}],
        }
    )
    return ChildTarget(3, 30, 2, definition)


def test_a_child_of_a_concurrency_limited_workflow_starts_with_its_key() -> None:
    # The store admits it through flow control by that key (children.start,
    # docs/contract.md#flow-control).
    run = parent(input={"order": "{{ input.order }}"})
    run.child_targets = {"invoicing": limited({"limit": 1, "key": "{{ input.order }}"})}
    run.started()
    run.advance()
    [start] = run.changes.child_starts
    assert start.concurrency_key == "o-1"
    assert run.steps["invoice"].status == "waiting"
    run = parent()
    run.child_targets = {"invoicing": limited({"limit": 1})}
    run.started()
    run.advance()
    assert run.changes.child_starts[0].concurrency_key == ""


def test_a_childs_concurrency_key_that_does_not_render_fails_the_step_saying_why() -> None:
    run = parent(input={"order": "{{ input.order }}"})
    run.child_targets = {"invoicing": limited({"limit": 1, "key": "{{ input.customer }}"})}
    run.started()
    run.advance()
    assert run.changes.child_starts == []
    assert run.steps["invoice"].status == "failed"
    assert "not started: concurrency key" in (run.steps["invoice"].error or "")


def test_an_input_the_childs_schema_refuses_fails_the_step_naming_where() -> None:
    schema = {"type": "object", "required": ["order"], "properties": {"order": {"type": "integer"}}}
    checked = parse_definition(
        {
            "name": "c",
            "input_schema": schema,
            "steps": [{"id": "x", "type": "transform", "output": 1}],
        }
    )
    run = parent(input={"order": "{{ input.order }}"})
    run.child_targets = {"invoicing": ChildTarget(3, 30, 2, checked)}
    run.started()
    run.advance()
    assert run.changes.child_starts == []
    assert "input:" in (run.steps["invoice"].error or "") and "$.order" in (
        run.steps["invoice"].error or ""
    )
