"""The randomized run's no-lost-event rule (tests/soak/promises.lost_events): it must
report an event acknowledged while its wait was open (or before it opened) and not taken,
and must not cry wolf on an event that came after the timeout, one the step took, or a
wait that did not time out."""

from __future__ import annotations

from typing import Any

from tests.soak.keyed_events import AWAIT_TIMEOUT_S, EventTry, SentEvent
from tests.soak.promises import CLOCK_SLACK_S, lost_events

OPENED = 1000.0
CLOSES = OPENED + AWAIT_TIMEOUT_S


def _event(acked_at: float | None, key: str = "ord-1", status: int = 202) -> SentEvent:
    event = SentEvent(key, {"order_id": key})
    event.tries.append(EventTry(acked_at or 0.0, acked_at or 0.0, None, None))
    if acked_at is not None:
        event.tries.append(EventTry(acked_at - 0.1, acked_at, status, "id"))
    return event


def _round(status: str = "failed", ended_by: str = "wait.timed_out") -> dict[str, Any]:
    return {"key": "ord-1", "status": status, "ended_by": ended_by, "opened": OPENED}


def test_an_event_acknowledged_while_the_wait_was_open_and_not_taken_is_lost() -> None:
    events = {"a": _event(CLOSES - 1.0), "b": _event(OPENED - 2.0, status=200)}
    assert [d for d, _ in lost_events(_round(), [], events)] == ["a", "b"]


def test_an_event_after_the_timeout_or_within_the_clock_slack_is_not_lost() -> None:
    events = {"a": _event(CLOSES + 0.5), "b": _event(CLOSES - CLOCK_SLACK_S / 2)}
    assert lost_events(_round(), [], events) == []


def test_a_taken_unacknowledged_or_other_key_event_is_not_lost() -> None:
    events = {"a": _event(OPENED + 1), "b": _event(None), "c": _event(OPENED + 1, "ord-2")}
    assert lost_events(_round(), [{"delivery_id": "a"}], events) == []


def test_a_wait_that_did_not_time_out_loses_nothing() -> None:
    events = {"a": _event(OPENED + 1)}
    assert lost_events(_round("succeeded", "wait.resumed"), [], events) == []
    assert lost_events(_round("cancelled", "wait.timed_out"), [], events) == []
