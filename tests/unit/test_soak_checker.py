"""The randomized run's rules (tests/soak/checker.py): which sends of an unsafe request an
operator asked for, and which late sends a freeze explains. A checker that miscounts
would hide duplicates or cry wolf."""

from __future__ import annotations

from tests.soak.checker import (
    SENT_AFTER_RESUME_S,
    Freeze,
    freezes,
    sent_after_freeze,
    unasked_sends,
)
from tests.soak.history import Fault, OperatorAction

EID = "01a23100-0000-7000-8000-000000000000"


def _action(wall: float, action: str, before: str, status: int | None = None) -> OperatorAction:
    code = status if status is not None else (202 if action == "retry" else 200)
    step = "charge" if action == "resolve" else None
    return OperatorAction(
        0.0, wall, action, EID, code, step_id=step, steps_before={"charge": before}
    )


def test_one_send_needs_no_operator() -> None:
    assert unasked_sends([], EID, "charge", [1.0]) == []


def test_a_second_send_nobody_asked_for_is_reported() -> None:
    assert unasked_sends([], EID, "charge", [1.0, 2.0]) == [2.0]


def test_a_retry_of_an_unknown_or_failed_step_allows_one_more_send() -> None:
    for before in ("unknown", "failed"):
        assert unasked_sends([_action(1.5, "retry", before)], EID, "charge", [1.0, 2.0]) == []
        assert unasked_sends([_action(1.5, "retry", before)], EID, "charge", [1.0, 2, 3]) == [3]


def test_a_retry_of_a_cancelled_step_asks_for_nothing() -> None:
    assert unasked_sends([_action(1.5, "retry", "cancelled")], EID, "charge", [1.0, 2.0]) == [2.0]


def test_a_refused_retry_asks_for_nothing() -> None:
    refused = _action(1.5, "retry", "unknown", status=409)
    assert unasked_sends([refused], EID, "charge", [1.0, 2.0]) == [2.0]


def test_after_a_resolve_no_send_is_asked_for_until_the_next_retry() -> None:
    resolved = _action(1.5, "resolve", "unknown")
    # The step was never sent before it was reaped; a worker sent it after the resolve.
    assert unasked_sends([resolved], EID, "charge", [2.0]) == [2.0]
    retried = _action(3.0, "retry", "failed")
    assert unasked_sends([resolved, retried], EID, "charge", [1.0, 4.0]) == []


def test_a_retry_counts_from_when_the_operator_looked() -> None:
    # A stale send between the look and the retry's own send: two sends, one allowed.
    assert unasked_sends([_action(1.5, "retry", "unknown")], EID, "charge", [1.0, 1.6, 2.0]) == [
        2.0
    ]


def test_other_executions_do_not_count() -> None:
    other = OperatorAction(0.0, 1.5, "retry", "another", 202, steps_before={"charge": "unknown"})
    assert unasked_sends([other], EID, "charge", [1.0, 2.0]) == [2.0]


# ---- stale sends and freezes (seed 204: a SIGSTOP between the fence and the first byte) --


def _fault(at: float, op: str, target: str) -> Fault:
    return Fault(at, op, target)


def test_a_freeze_is_paired_with_its_resume_or_else_the_heal() -> None:
    faults = [
        _fault(1.0, "pause", "w1"),
        _fault(2.0, "pause", "w2"),
        _fault(3.0, "resume", "w1"),
        _fault(9.0, "quiet", "all"),
    ]
    assert freezes(faults, 100.0) == [Freeze("w1", 101.0, 103.0), Freeze("w2", 102.0, 109.0)]


def test_a_request_arriving_as_its_frozen_worker_resumes_is_no_stale_send() -> None:
    frozen = [Freeze("w1", 10.0, 13.0)]
    # claimed at 9.9, frozen at 10.0 (past the fence), sent the moment it ran again
    assert sent_after_freeze("w1", 9.9, 13.02, frozen)


def test_a_freeze_before_the_claim_or_of_another_worker_excuses_nothing() -> None:
    frozen = [Freeze("w1", 10.0, 13.0)]
    assert not sent_after_freeze("w1", 11.0, 13.02, frozen)  # claimed while frozen: no
    assert not sent_after_freeze("w2", 9.9, 13.02, frozen)


def test_a_request_long_after_the_resume_is_still_a_stale_send() -> None:
    frozen = [Freeze("w1", 10.0, 13.0)]
    assert not sent_after_freeze("w1", 9.9, 13.0 + SENT_AFTER_RESUME_S + 0.5, frozen)
    assert not sent_after_freeze("w1", 9.9, 12.0, frozen)  # while still frozen: not ours
