"""The DAG rules of flowforge/domain/engine.py, driven without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowforge.domain.definitions import RetryPolicy, parse_definition
from flowforge.domain.engine import Run, StepState, backoff_seconds
from flowforge.domain.model import Outcome

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
OPERATOR = {"kind": "api_key", "id": 7, "name": "ops"}


def make_run(steps: list[dict[str, Any]], payload: Any = None, *, stored: bool = False) -> Run:
    definition = parse_definition({"name": "t", "steps": steps}, stored=stored)
    roots = set(definition.roots())
    return Run(
        execution_id="00000000-0000-0000-0000-000000000001",
        workflow="wf",
        version=1,
        status="queued",
        input=payload if payload is not None else {},
        definition=definition,
        steps={
            s.id: StepState(s.id, s.type, "ready" if s.id in roots else "pending")
            for s in definition.steps
        },
        now=NOW,
    )


def statuses(run: Run) -> dict[str, str]:
    return {sid: s.status for sid, s in run.steps.items()}


def http(step_id: str, method: str = "GET", **extra: Any) -> dict[str, Any]:
    return {
        "id": step_id,
        "type": "http_request",
        "request": {"method": method, "url": "http://127.0.0.1:1/x"},
        **extra,
    }


def test_chain_of_transforms_runs_inline_in_one_unit_of_work() -> None:
    run = make_run(
        [
            {"id": "a", "type": "transform", "output": {"n": "{{ input.n }}"}},
            {"id": "b", "type": "transform", "depends_on": ["a"], "output": "{{ a.n }}"},
            {
                "id": "c",
                "type": "transform",
                "depends_on": ["b"],
                "output": ["{{ b }}", "x{{ b }}"],
            },
        ],
        {"n": 7},
    )
    run.started()
    run.advance()
    assert statuses(run) == {"a": "succeeded", "b": "succeeded", "c": "succeeded"}
    assert run.steps["c"].output == [7, "x7"]
    assert run.status == "succeeded"
    assert len(run.new_attempts) == 3
    assert run.dispatch == []


def test_parallel_branches_join_only_when_both_parents_are_done() -> None:
    run = make_run(
        [
            http("fetch"),
            {"id": "left", "type": "transform", "depends_on": ["fetch"], "output": 1},
            http("right", depends_on=["fetch"]),
            {
                "id": "join",
                "type": "transform",
                "depends_on": ["left", "right"],
                "output": {"l": "{{ left }}", "r": "{{ right.status }}"},
            },
        ]
    )
    claimed = run.claim("fetch", "w1")
    run.record_outcome("fetch", claimed.fencing_token, Outcome("succeeded", output={"status": 200}))
    assert statuses(run)["left"] == "succeeded"
    assert statuses(run)["right"] == "ready"
    assert statuses(run)["join"] == "pending"
    assert run.dispatch == ["right"]
    token = run.claim("right", "w1").fencing_token
    run.record_outcome("right", token, Outcome("succeeded", output={"status": 201}))
    assert run.steps["join"].output == {"l": 1, "r": 201}
    assert run.status == "succeeded"


def test_false_condition_skips_and_skips_propagate_to_all_skipped_children() -> None:
    run = make_run(
        [
            {"id": "a", "type": "transform", "output": {"total": 50}},
            {
                "id": "big",
                "type": "transform",
                "depends_on": ["a"],
                "when": {"path": "a.total", "op": "gt", "value": 100},
                "output": 1,
            },
            {"id": "after_big", "type": "transform", "depends_on": ["big"], "output": 2},
            {"id": "mixed", "type": "transform", "depends_on": ["big", "a"], "output": 3},
        ]
    )
    run.advance()
    assert statuses(run) == {
        "a": "succeeded",
        "big": "skipped",
        "after_big": "skipped",
        "mixed": "succeeded",
    }
    assert run.status == "succeeded"


def test_unresolvable_template_fails_the_step_and_cancels_what_cannot_run() -> None:
    run = make_run(
        [
            {"id": "a", "type": "transform", "output": "{{ input.missing }}"},
            {"id": "b", "type": "transform", "depends_on": ["a"], "output": 1},
        ]
    )
    run.advance()
    assert statuses(run) == {"a": "failed", "b": "cancelled"}
    assert "missing" in run.steps["a"].error
    assert run.status == "failed"


def test_delay_waits_then_succeeds_when_woken() -> None:
    run = make_run(
        [
            {"id": "d", "type": "delay", "duration_s": 60},
            {"id": "t", "type": "transform", "depends_on": ["d"], "output": "done"},
        ]
    )
    run.advance()
    assert run.steps["d"].status == "waiting"
    assert run.steps["d"].wake_at == NOW + timedelta(seconds=60)
    assert run.status == "waiting"
    run.steps["d"].status = "ready"  # what the timer scanner does when wake_at passes
    run.advance()
    assert statuses(run) == {"d": "succeeded", "t": "succeeded"}


def test_delay_until_in_the_past_does_not_wait() -> None:
    run = make_run(
        [{"id": "d", "type": "delay", "until": "{{ input.at }}"}],
        {"at": (NOW - timedelta(hours=1)).isoformat()},
    )
    run.advance()
    assert run.steps["d"].status == "succeeded"


@pytest.mark.parametrize("at", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"])
def test_delay_until_an_instant_that_would_not_load_back_fails_the_step(at: str) -> None:
    """Stored, such a wake_at would make every later load of the execution fail."""
    run = make_run([{"id": "d", "type": "delay", "until": "{{ input.at }}"}], {"at": at})
    run.advance()
    assert run.steps["d"].status == "failed"
    assert "between 0001-01-02 and 9999-12-30" in (run.steps["d"].error or "")
    assert run.steps["d"].wake_at is None


def test_retryable_failure_backs_off_then_fails_when_attempts_run_out() -> None:
    run = make_run([http("a", retry={"max_attempts": 2, "initial_interval_s": 10})])
    token = run.claim("a", "w").fencing_token
    run.record_outcome("a", token, Outcome("retry", error="HTTP 503", http_status=503))
    state = run.steps["a"]
    assert state.status == "waiting"
    assert NOW + timedelta(seconds=5) <= state.wake_at <= NOW + timedelta(seconds=10)
    assert run.status == "waiting"
    state.status = "ready"
    token = run.claim("a", "w").fencing_token
    assert token == 2
    run.record_outcome("a", token, Outcome("retry", error="HTTP 503", http_status=503))
    assert state.status == "failed"
    assert run.status == "failed"


def test_retry_after_is_honoured_up_to_the_maximum_interval() -> None:
    run = make_run([http("a", retry={"initial_interval_s": 1, "max_interval_s": 30})])
    token = run.claim("a", "w").fencing_token
    run.record_outcome("a", token, Outcome("retry", error="429", retry_after_s=20))
    assert run.steps["a"].wake_at == NOW + timedelta(seconds=20)


def test_lost_lease_repeats_safe_requests_and_marks_unsafe_ones_unknown() -> None:
    run = make_run([http("get"), http("post", method="POST")])
    run.claim("get", "w1")
    run.claim("post", "w1")
    run.recover_lease("get")
    run.recover_lease("post")
    assert run.steps["get"].status == "waiting"
    assert run.steps["post"].status == "unknown"
    outcomes = {a.step_id: a.outcome for a in run.finished_attempts}
    assert outcomes == {"get": "lost_lease", "post": "unknown"}
    assert run.status == "waiting"
    run.steps["get"].status = "succeeded"
    run.derive_status()
    assert run.status == "needs_attention"


def test_resolve_succeeded_continues_with_the_given_output() -> None:
    run = make_run(
        [
            http("post", method="POST"),
            {"id": "t", "type": "transform", "depends_on": ["post"], "output": "{{ post.id }}"},
        ]
    )
    run.claim("post", "w1")
    run.recover_lease("post")
    run.resolve("post", "succeeded", {"id": 42}, actor=OPERATOR)
    assert run.steps["t"].output == 42
    assert run.status == "succeeded"


def test_cancel_stops_waiting_work_at_once_and_running_work_at_its_boundary() -> None:
    run = make_run(
        [
            http("slow"),
            {"id": "d", "type": "delay", "duration_s": 86400},
            {"id": "after", "type": "transform", "depends_on": ["slow"], "output": 1},
        ]
    )
    run.advance()
    token = run.claim("slow", "w").fencing_token
    run.cancel(actor=OPERATOR)
    assert run.steps["d"].status == "cancelled"
    assert run.status == "running"  # the request in flight has not come back yet
    run.record_outcome("slow", token, Outcome("succeeded", output={"status": 200}))
    assert run.steps["slow"].status == "succeeded"  # it happened: cancel does not undo that
    assert run.steps["slow"].output == {"status": 200}
    assert run.steps["after"].status == "cancelled"
    assert run.status == "cancelled"


def test_cancel_and_retry_never_touch_succeeded_or_unknown_steps() -> None:
    run = make_run(
        [
            http("paid", method="POST"),
            http("sent", method="POST"),
            http("lost", method="POST"),
            http("next", depends_on=["paid", "sent", "lost"]),
        ]
    )
    tokens = {sid: run.claim(sid, "w").fencing_token for sid in ("paid", "sent", "lost")}
    run.record_outcome("paid", tokens["paid"], Outcome("succeeded", output={"id": 1}))
    run.recover_lease("lost")  # the worker died mid-POST
    assert statuses(run)["lost"] == "unknown"
    run.cancel(actor=OPERATOR)
    assert statuses(run) == {
        "paid": "succeeded",
        "sent": "running",
        "lost": "unknown",
        "next": "cancelled",
    }
    run.record_outcome("sent", tokens["sent"], Outcome("unknown", error="no response"))
    assert run.status == "cancelled"
    assert statuses(run)["sent"] == "unknown"

    run.dispatch.clear()
    assert run.retry(actor=OPERATOR) == ["next"]
    assert statuses(run) == {
        "paid": "succeeded",
        "sent": "unknown",
        "lost": "unknown",
        "next": "pending",
    }
    assert run.dispatch == []  # nothing is sent again
    assert run.status == "needs_attention"


def test_a_step_that_fails_after_cancel_is_cancelled_and_not_retried_until_asked() -> None:
    run = make_run([http("a", retry={"max_attempts": 5})])
    token = run.claim("a", "w").fencing_token
    run.cancel(actor=OPERATOR)
    run.record_outcome("a", token, Outcome("retry", error="HTTP 503", http_status=503))
    assert statuses(run) == {"a": "cancelled"}
    assert run.status == "cancelled"


def test_operator_retry_reruns_only_failed_steps() -> None:
    run = make_run(
        [
            {"id": "a", "type": "transform", "output": 1},
            http("b", method="POST", depends_on=["a"]),
        ]
    )
    run.advance()
    token = run.claim("b", "w").fencing_token
    run.record_outcome("b", token, Outcome("failed", error="HTTP 400", http_status=400))
    assert run.status == "failed"
    run.dispatch.clear()  # save_run clears what it wrote
    run.retry(actor=OPERATOR)
    assert statuses(run) == {"a": "succeeded", "b": "ready"}
    assert run.dispatch == ["b"]
    assert run.steps["b"].attempts == 0
    assert run.status == "running"


@pytest.mark.parametrize("attempts", [1, 2, 5, 20])
def test_backoff_is_jittered_within_half_to_full_capped_interval(attempts: int) -> None:
    policy = RetryPolicy(
        max_attempts=30, initial_interval_s=1, backoff_coefficient=2, max_interval_s=60
    )
    full = min(60, 2 ** (attempts - 1))
    for _ in range(50):
        assert full / 2 <= backoff_seconds(policy, attempts) <= full


@pytest.mark.parametrize(
    "until", ["9999-12-31T23:59:59-23:00", "0001-01-01T00:00:00+05:00", "9999-12-31T00:00:00Z"]
)
def test_a_literal_until_that_cannot_be_stored_fails_the_delay_when_it_starts(until: str) -> None:
    """A version published before the range rule still loads, and its delay fails."""
    run = make_run([{"id": "d", "type": "delay", "until": until}], stored=True)
    run.advance()
    assert run.steps["d"].status == "failed"
    assert run.steps["d"].wake_at is None
    assert "can store" in (run.steps["d"].error or "")


def test_every_operator_action_names_its_actor_in_the_history() -> None:
    run = make_run([http("lost", method="POST"), http("next", depends_on=["lost"])])
    run.claim("lost", "w")
    run.recover_lease("lost")
    run.resolve("lost", "failed", None, actor=OPERATOR)
    run.retry(actor={"kind": "cli", "name": "cli@box"})
    run.cancel(actor=OPERATOR)
    actors = {kind: detail.get("actor") for _, kind, detail in run.events if "actor" in detail}
    assert actors == {
        "step.resolved": OPERATOR,
        "execution.retried": {"kind": "cli", "name": "cli@box"},
        "execution.cancel_requested": OPERATOR,
    }
    assert run.steps["next"].status == "cancelled"


def test_a_reopened_unknown_is_settled_by_the_answer_and_says_who_settled_it() -> None:
    run = make_run([http("lost", method="POST"), http("next", depends_on=["lost"])])
    token = run.claim("lost", "w").fencing_token
    run.recover_lease("lost")
    assert run.status == "needs_attention"
    run.reopen_unknown("lost", token, "w", "succeeded")
    run.record_outcome("lost", token, Outcome("succeeded", output={"ok": True}))
    assert run.steps["lost"].status == "succeeded"
    assert run.steps["next"].status == "ready"
    assert run.status == "running"
    settled = [d for _, kind, d in run.events if kind == "step.settled"]
    assert settled == [
        {"fencing_token": token, "outcome": "succeeded", "actor": {"kind": "worker", "name": "w"}}
    ]


def test_a_deadline_is_stopped_by_flow_control() -> None:
    run = make_run([http("a")])
    run.pass_deadline()
    requested = [d for _, kind, d in run.events if kind == "execution.cancel_requested"]
    assert requested == [
        {"actor": {"kind": "system", "name": "flow control"}, "reason": "deadline"}
    ]
