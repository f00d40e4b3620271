"""The delay kind (flowforge/domain/kinds/delay.py) through the interface the core calls:
registered for its step type, pure, and `start` waiting, ending or failing a delay."""

from __future__ import annotations

from datetime import timedelta

from flowforge.domain.engine import KINDS, PURE_TYPES
from flowforge.domain.kinds import delay
from flowforge.domain.model import StepType
from tests.unit.test_engine import NOW, make_run, statuses


def test_the_core_asks_the_delay_kind_for_delay_steps() -> None:
    assert KINDS[StepType.DELAY] is delay.KIND
    assert StepType.DELAY in PURE_TYPES


def test_start_waits_until_the_duration_passed_and_the_timer_ends_it() -> None:
    run = make_run([{"id": "d", "type": "delay", "duration_s": 30}])
    step = run.definition.step("d")
    delay.KIND.start(run, step)
    assert statuses(run) == {"d": "waiting"}
    assert run.steps["d"].wake_at == NOW + timedelta(seconds=30)
    run.steps["d"].status = "ready"  # what the timer scanner does when wake_at comes
    delay.KIND.start(run, step)
    assert statuses(run) == {"d": "succeeded"}
    assert run.steps["d"].output == {"waited_until": (NOW + timedelta(seconds=30)).isoformat()}


def test_start_fails_a_delay_whose_until_renders_to_no_timestamp() -> None:
    run = make_run([{"id": "d", "type": "delay", "until": "{{ input.at }}"}], {"at": 5})
    delay.KIND.start(run, run.definition.step("d"))
    assert statuses(run) == {"d": "failed"}
    assert run.steps["d"].error == "delay: until must render to an ISO-8601 timestamp string"
