"""The console's pure parts: the DAG's columns, the attempts' time axis, and the input
path = value filter's containment document."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flowforge.api.console import forms, graph
from flowforge.errors import InvalidParameter


def test_steps_sit_in_columns_by_their_longest_path_from_a_root() -> None:
    steps = [
        {"id": "a", "type": "transform"},
        {"id": "b", "type": "transform", "depends_on": ["a"]},
        {"id": "c", "type": "transform"},
        {"id": "d", "type": "transform", "depends_on": ["b", "c"]},
    ]
    dag = graph.layout(steps, {"a": "succeeded", "d": "unknown"})
    x = {box.id: box.x for box in dag.boxes}
    assert x["a"] == x["c"] < x["b"] < x["d"]
    assert {box.id: box.status for box in dag.boxes}["d"] == "unknown"
    assert {box.id: box.status for box in dag.boxes}["b"] == "pending"
    assert len(dag.edges) == 3
    assert dag.width >= x["d"] + graph.BOX_W


def test_attempts_are_placed_on_one_axis_with_their_durations() -> None:
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    attempts = [
        {"step_id": "s", "attempt": 1, "started_at": t0, "finished_at": t0 + timedelta(seconds=1),
         "outcome": "failed", "duration_ms": 1000},
        {"step_id": "s", "attempt": 2, "started_at": t0 + timedelta(seconds=3),
         "finished_at": None, "outcome": None, "duration_ms": None},
    ]  # fmt: skip
    line = graph.timeline(t0, t0 + timedelta(seconds=4), attempts, ["s", "t"])
    first, second = (bar for bar in line.bars if bar.kind == "attempt")
    assert line.rows == ["s"] and line.span_s == 4
    assert first.x == 0 and first.width == graph.AXIS_W / 4
    assert second.x == graph.AXIS_W * 3 / 4 and second.outcome == "running"
    assert "1000 ms" in first.label and "1000 ms so far" in second.label
    # The two seconds between them are the back-off, drawn and named.
    (backoff,) = (bar for bar in line.bars if bar.kind == "backoff")
    assert backoff.x == graph.AXIS_W / 4 and backoff.width == graph.AXIS_W / 2
    assert "back-off before attempt 2, 2.000 s" in backoff.label


def test_delays_waits_and_unanswered_attempts_leave_no_unexplained_gap() -> None:
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    at = lambda s: (t0 + timedelta(seconds=s)).isoformat()  # noqa: E731
    steps = [
        {"id": "nap", "type": "delay", "status": "succeeded", "started_at": at(0),
         "finished_at": at(5), "wake_at": None},
        {"id": "ask", "type": "wait", "status": "waiting", "started_at": at(5),
         "finished_at": None, "wake_at": at(3600)},
        {"id": "call", "type": "http_request", "status": "waiting", "started_at": at(5),
         "finished_at": None, "wake_at": at(12)},
    ]  # fmt: skip
    attempts = [
        # No answer: no recorded duration, but it was given up on after 2 s.
        {"step_id": "call", "attempt": 1, "started_at": t0 + timedelta(seconds=5),
         "finished_at": t0 + timedelta(seconds=7), "outcome": "unknown", "duration_ms": None},
    ]  # fmt: skip
    line = graph.timeline(t0, t0 + timedelta(seconds=10), attempts, ["nap", "ask", "call"], steps)
    assert line.rows == ["nap", "ask", "call"]
    kinds = {(bar.step, bar.kind): bar for bar in line.bars}
    assert kinds["nap", "delay"].label == "nap: delay, 5.000 s"
    assert kinds["nap", "delay"].width == graph.AXIS_W / 2
    assert kinds["ask", "wait"].label.startswith("ask: waiting for its resume, 5.000 s, wakes ")
    assert "2000 ms" in kinds["call", "attempt"].label
    assert "next attempt at 2026-12-01 00:00:12.000Z" in kinds["call", "backoff"].label
    assert graph.attempt_took(attempts[0], t0) == "2000 ms"


def test_an_input_path_and_value_become_a_containment_document() -> None:
    assert forms._containment("customer.id", "42") == {"customer": {"id": 42}}
    assert forms._containment("tier", "gold") == {"tier": "gold"}
    assert forms._containment("tier", '"42"') == {"tier": "42"}
    for path in ("a..b", "a.b c", ".".join("x" * 9)):
        with pytest.raises(InvalidParameter):
            forms._containment(path, "1")
