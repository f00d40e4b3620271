"""The pause rules of flowforge/domain/engine.py (docs/contract.md#pause), driven without a
database: a paused run promotes and dispatches nothing, records what was in flight, resumes as it
was, and retry.on_exhausted "pause" holds the run at the step whose tries ran out."""

from __future__ import annotations

from flowforge.domain.model import Outcome
from tests.unit.test_engine import OPERATOR, http, make_run, statuses

RETRY = {"max_attempts": 1, "on_exhausted": "pause"}


def test_a_paused_run_records_the_request_in_flight_and_starts_nothing_after_it() -> None:
    run = make_run([http("a"), http("b", depends_on=["a"])])
    run.started()
    token = run.claim("a", "w1").fencing_token
    run.pause("operator", actor=OPERATOR)
    assert run.status == "paused" and run.paused_from == "running"
    run.take_changes()
    run.record_outcome("a", token, Outcome("succeeded", output={"ok": 1}))
    assert statuses(run) == {"a": "succeeded", "b": "pending"}
    assert run.status == "paused" and run.dispatch == []
    assert run.hold()
    run.unpause(actor=OPERATOR)
    assert statuses(run) == {"a": "succeeded", "b": "ready"}
    assert run.status == "running" and run.dispatch == ["b"] and run.pause_reason is None


def test_a_failure_in_flight_ends_a_paused_run_and_a_cancel_stops_it() -> None:
    run = make_run([http("a"), http("b", depends_on=["a"])])
    run.started()
    token = run.claim("a", "w1").fencing_token
    run.pause("operator", actor=OPERATOR)
    run.record_outcome("a", token, Outcome("failed", error="400"))
    assert run.status == "failed" and run.pause_reason is None
    other = make_run([http("a")])
    other.pause("operator", actor=OPERATOR)
    other.cancel(actor=OPERATOR)
    assert other.status == "cancelled" and other.paused_from is None


def test_exhausted_tries_pause_at_the_step_and_resume_runs_it_again() -> None:
    run = make_run([http("a", retry=RETRY), http("b", depends_on=["a"])])
    run.started()
    token = run.claim("a", "w1").fencing_token
    run.record_outcome("a", token, Outcome("retry", error="503"))
    assert statuses(run) == {"a": "failed", "b": "pending"}
    assert run.status == "paused" and run.pause_reason == "exhausted"
    (paused,) = [d for _s, k, d in run.events if k == "execution.paused"]
    assert paused["step"] == "a" and paused["reason"] == "exhausted"
    rerun = run.unpause(actor=OPERATOR)
    assert rerun == ["a"] and run.steps["a"].status == "ready" and run.steps["a"].attempts == 0
    assert run.dispatch == ["a"]


def test_fail_paused_fails_the_run_as_on_exhausted_fail_would() -> None:
    run = make_run([http("a", retry=RETRY), http("b", depends_on=["a"])])
    run.started()
    run.record_outcome("a", run.claim("a", "w1").fencing_token, Outcome("retry", error="503"))
    run.fail_paused(actor=OPERATOR)
    assert run.status == "failed" and statuses(run) == {"a": "failed", "b": "cancelled"}


def test_a_run_of_a_paused_workflow_pauses_itself_when_touched() -> None:
    run = make_run([http("a")])
    run.workflow_paused_by = OPERATOR
    assert run.hold()
    assert run.status == "paused" and run.pause_reason == "workflow" and run.paused_from == "queued"
    (paused,) = [d for _s, k, d in run.events if k == "execution.paused"]
    assert paused["actor"] == OPERATOR


def test_paused_while_queued_still_expires() -> None:
    run = make_run([http("a")])
    run.pause("operator", actor=OPERATOR)
    run.expired = True
    run.enforce_time_limits()
    assert run.status == "cancelled" and run.stop_reason == "expired"
