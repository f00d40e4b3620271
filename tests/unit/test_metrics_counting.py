"""What flowforge.observe.metrics counts from a unit of work's changes, and when: only after the
block that holds the transaction ended without an error (store/runs.after_commit). What the
changes did is the engine's word (changes.happened, engine.since_resume); metrics counts it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from prometheus_client import REGISTRY

from flowforge.domain import changes as changes_
from flowforge.domain import engine
from flowforge.domain.definitions import parse_definition
from flowforge.domain.engine import Changes, FinishedAttempt, NewAttempt, Run, StepState
from flowforge.domain.model import EventKind
from flowforge.observe import metrics
from flowforge.store import runs
from flowforge.usecases import intake
from tests.support.definitions import transform, wait, workflow


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def changes() -> Changes:
    """A checkpoint: an http attempt succeeded, a transform ran, a wait began."""
    now = datetime.now(UTC)
    done = Changes(str(intake.uuid7()))
    done.steps = {
        "call": StepState(
            "call",
            "http_request",
            "succeeded",
            started_at=now - timedelta(seconds=2),
            finished_at=now,
        ),
        "shape": StepState("shape", "transform", "succeeded", started_at=now, finished_at=now),
        "approval": StepState("approval", "wait", "waiting", started_at=now),
    }
    done.finished_attempts = [FinishedAttempt("call", 1, "succeeded", duration_ms=2000)]
    done.new_attempts = [NewAttempt("shape", 0, None, "succeeded")]
    done.events = [("approval", "step.waiting", {}), ("other", EventKind.WAIT_TIMED_OUT, {})]
    return done


NAMES = [
    ("flowforge_attempts_total", {"type": "http_request", "outcome": "succeeded"}),
    ("flowforge_attempts_total", {"type": "transform", "outcome": "succeeded"}),
    ("flowforge_waits_started_total", {}),
    ("flowforge_waits_ended_total", {"outcome": "timed_out"}),
    ("flowforge_step_duration_seconds_count", {"type": "http_request"}),
]


def snapshot() -> list[float]:
    return [sample(name, **labels) for name, labels in NAMES]


def test_the_engine_says_what_a_unit_of_work_did() -> None:
    done = changes_.happened(changes())
    assert done.attempts_ended == (("transform", "succeeded"), ("http_request", "succeeded"))
    assert done.waits_started == 1
    assert done.waits_ended == (EventKind.WAIT_TIMED_OUT,)
    assert [(kind, round(took)) for kind, took in done.steps_ended] == [
        ("http_request", 2),
        ("transform", 0),
    ]
    assert done.execution_ended is None
    assert changes_.happened(Changes("e")) is changes_.NOTHING_HAPPENED


def counted_after_commit(done: Changes) -> None:
    """What runs.save_run does with a saved unit of work: its listeners hear of it after
    the COMMIT."""
    runs.on_commit(partial(metrics.saved, done))


def test_a_committed_unit_of_work_is_counted_after_it_ends() -> None:
    before = snapshot()
    with runs.after_commit():
        counted_after_commit(changes())
        assert snapshot() == before  # not yet: the COMMIT has not happened
    assert [b - a for a, b in zip(before, snapshot(), strict=True)] == [1, 1, 1, 1, 1]


def test_a_rolled_back_unit_of_work_counts_nothing() -> None:
    before = snapshot()
    with pytest.raises(RuntimeError), runs.after_commit():
        counted_after_commit(changes())
        raise RuntimeError("the commit failed")
    assert snapshot() == before
    # And the next unit of work is not haunted by the discarded one.
    with runs.after_commit():
        pass
    assert snapshot() == before


def test_a_nested_block_counts_with_the_outermost() -> None:
    before = snapshot()
    with runs.after_commit():
        with runs.after_commit():
            counted_after_commit(changes())
        assert snapshot() == before
    assert snapshot() != before


def waited_run(waiting: StepState) -> Run:
    definition = parse_definition(
        workflow(
            wait("approval", 60),
            transform("after", {"ok": True}, after=("approval",)),
            name="approval",
        )
    )
    now = datetime.now(UTC)
    return Run(
        "e",
        "approval",
        1,
        "running",
        {},
        definition,
        {"approval": waiting, "after": StepState("after", "transform", "pending")},
        now,
    )


def test_the_engine_says_how_long_ago_a_resume_let_a_step_start() -> None:
    now = datetime.now(UTC)
    resumed = StepState("approval", "wait", "succeeded", finished_at=now - timedelta(seconds=3))
    assert round(engine.since_resume(waited_run(resumed), "after") or 0) == 3
    # A timed-out wait keeps its wake_at: no resume to measure.
    timed_out = StepState(
        "approval", "wait", "succeeded", wake_at=now, finished_at=now - timedelta(seconds=3)
    )
    assert engine.since_resume(waited_run(timed_out), "after") is None


def test_an_execution_duration_runs_from_the_time_in_its_id() -> None:
    done = Changes(str(intake.uuid7()))
    done.execution_changed, done.status = True, "succeeded"
    done.events = [(None, "execution.succeeded", {})]
    count = "flowforge_execution_duration_seconds_count"
    before = sample(count, status="succeeded")
    counted_after_commit(done)  # outside any unit of work: counted at once
    assert sample(count, status="succeeded") == before + 1
    assert metrics._accepted_at("00000000-0000-4000-8000-000000000000") is None


@pytest.mark.parametrize(
    ("status", "problem_type", "reason"),
    [
        (400, None, "bad_request"),
        (401, None, "signature"),
        (404, None, "not_found"),
        (429, "urn:flowforge:problem:too-many-requests", "rate_limited"),
        (429, metrics.QUEUE_FULL_TYPE, "queue_full"),
        (503, None, "unavailable"),
        (500, None, "error"),
        (418, None, "error"),
    ],
)
def test_refusal_reasons(status: int, problem_type: str | None, reason: str) -> None:
    assert metrics.refusal_reason(status, problem_type) == reason
