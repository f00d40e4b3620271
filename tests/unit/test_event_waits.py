"""Event waits without a database (docs/contract.md#events): the definition's rules, and
what the engine does when an event wait opens or takes an event."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.definitions import DefinitionInvalid, EventWait, parse_definition
from tests.unit.test_engine import make_run, statuses


def event_wait(**extra: Any) -> dict[str, Any]:
    return {
        "id": "paid",
        "type": "wait",
        "timeout_s": 60,
        "event": "payment.settled",
        "key": "{{ input.order_id }}",
        **extra,
    }


def problems(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition(doc)
    return {e["path"]: e["message"] for e in caught.value.errors}


def test_an_event_wait_parses_with_its_defaults() -> None:
    step = parse_definition({"name": "t", "steps": [event_wait()]}).step("paid")
    assert step.event == EventWait("payment.settled", "{{ input.order_id }}", None, None)
    step = parse_definition(
        {"name": "t", "steps": [event_wait(**{"from": "stripe-intake", "lookback_s": 0})]}
    ).step("paid")
    assert step.event == EventWait("payment.settled", "{{ input.order_id }}", "stripe-intake", 0)


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"event": "Payment Settled"}, "$.steps[0].event"),
        ({"key": ""}, "$.steps[0].key"),
        ({"key": "{{ steps.x }}"}, "$.steps[0].key"),
        ({"from": 7}, "$.steps[0].from"),
        ({"lookback_s": -1}, "$.steps[0].lookback_s"),
        ({"lookback_s": 2_592_001}, "$.steps[0].lookback_s"),
    ],
)
def test_bad_event_fields_are_refused_with_their_paths(fields: dict[str, Any], path: str) -> None:
    assert path in problems({"name": "t", "steps": [event_wait(**fields)]})


def test_event_fields_without_an_event_are_refused() -> None:
    step = {"id": "w", "type": "wait", "timeout_s": 5, "key": "k", "lookback_s": 1}
    found = problems({"name": "t", "steps": [step]})
    assert set(found) == {"$.steps[0].key", "$.steps[0].lookback_s"}


def test_emits_needs_a_signed_webhook_without_grouping() -> None:
    emits = {"event": "payment.settled", "key": "{{ input.data.object.id }}"}
    steps = [{"id": "n", "type": "transform", "output": 1}]
    signed = parse_definition({"name": "t", "steps": steps, "emits": emits})
    assert signed.emits is not None and signed.emits.name == "payment.settled"
    unsigned = {"name": "t", "trigger": {"webhook": {"auth": "none"}}, "steps": steps}
    assert "$.emits" in problems({**unsigned, "emits": emits})
    batched = {"webhook": {"auth": "stripe", "batch": {"max_items": 2, "window_s": 1}}}
    assert "$.emits" in problems({"name": "t", "trigger": batched, "steps": steps, "emits": emits})
    assert "$.emits" in problems({"name": "t", "steps": steps, "emits": None})
    assert "$.emits.key" in problems({"name": "t", "steps": steps, "emits": {"event": "x"}})
    # emits reads the delivery only: a step's output does not exist yet.
    steps_key = {"event": "x", "key": "{{ n.id }}"}
    assert "$.emits.key" in problems({"name": "t", "steps": steps, "emits": steps_key})


class Port:
    """The store's side, as domain/event_waits.EventPort: one kept event, or none."""

    def __init__(self, kept: tuple[str, Any] | None) -> None:
        self.kept = kept
        self.asked: list[tuple[str, str]] = []

    def early_event(
        self, step_id: str, wait: EventWait, key: str, lookback_s: float | None
    ) -> tuple[str, Any] | None:
        self.asked.append((step_id, key))
        return self.kept


def test_an_opening_wait_takes_a_kept_event_in_the_same_unit_of_work() -> None:
    run = make_run([event_wait()], {"order_id": 1001})
    run.event_port = port = Port(("ev-1", {"amount": 5}))
    run.advance()
    assert statuses(run) == {"paid": "succeeded"}
    assert run.steps["paid"].output == {"amount": 5}
    assert port.asked == [("paid", "1001")]  # an integer key renders as its digits
    changes = run.take_changes()
    assert changes.consumed_events == [("ev-1", "paid")] and changes.event_waits == []


def test_an_opening_wait_without_a_kept_event_registers_and_waits() -> None:
    run = make_run([event_wait(**{"from": "stripe-intake"})], {"order_id": "o-1"})
    run.event_port = Port(None)
    run.advance()
    assert statuses(run) == {"paid": "waiting"}
    changes = run.take_changes()
    assert changes.event_waits == [("paid", "payment.settled", "o-1", "stripe-intake")]
    # The sender's event then ends it, its payload the output, consumed with the change.
    run.receive_event("paid", "ev-2", {"amount": 9})
    assert statuses(run) == {"paid": "succeeded"}
    assert run.take_changes().consumed_events == [("ev-2", "paid")]


@pytest.mark.parametrize("payload", [{}, {"order_id": ""}, {"order_id": ["a"]}, {"order_id": True}])
def test_a_key_that_does_not_render_fails_the_step(payload: dict[str, Any]) -> None:
    run = make_run([event_wait()], payload)
    run.advance()
    assert statuses(run) == {"paid": "failed"}
    assert "event key" in (run.steps["paid"].error or "")


def test_a_wait_without_an_event_never_asks_the_store() -> None:
    run = make_run([{"id": "w", "type": "wait", "timeout_s": 5}])
    run.event_port = port = Port(("ev", 1))
    run.advance()
    assert statuses(run) == {"w": "waiting"} and port.asked == []
    assert run.take_changes().event_waits == []


class Loader:
    """A loader whose event port must not be asked for (a workflow without event waits)."""

    def early_resumes(self) -> dict[str, Any]:
        return {}

    def event_port(self) -> Port:
        raise AssertionError("a workflow without event waits asked for events")


def test_a_workflow_without_event_waits_pays_no_event_read() -> None:
    from flowforge.domain.kinds.wait import KIND

    run = make_run([{"id": "w", "type": "wait", "timeout_s": 5}])
    KIND.load(run, Loader())  # type: ignore[arg-type]
    assert run.event_port is None
