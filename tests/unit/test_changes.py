"""A unit of work's changes are a value the engine hands over: saving reads them, and the
run starts a new change log, so nothing is cleared behind anyone's back."""

from __future__ import annotations

from flowforge.domain.engine import Changes
from flowforge.domain.model import DEFAULT_LEASE_S, ExecutionStatus, StepStatus
from tests.unit.test_engine import http, make_run


def test_take_changes_hands_over_the_log_and_starts_a_new_one() -> None:
    run = make_run([http("fetch"), http("after", depends_on=["fetch"])])
    run.started()
    run.claim("fetch", "w1", 12.5)
    changes = run.take_changes()
    assert isinstance(changes, Changes)
    assert changes.execution_id == run.execution_id
    assert list(changes.steps) == ["fetch"]
    assert changes.steps["fetch"].status == StepStatus.RUNNING
    assert changes.leases == {"fetch": 12.5}
    assert [a.step_id for a in changes.new_attempts] == ["fetch"]
    assert changes.execution_changed and changes.status == ExecutionStatus.RUNNING
    assert [kind for _, kind, _ in changes.events] == ["execution.running", "step.running"]
    # The run goes on with an empty log; the handed-over value is left as it was.
    assert (run.events, run.dispatch, run.new_attempts, run.finished_attempts) == ([], [], [], [])
    assert run.take_changes() == Changes(
        run.execution_id, status=ExecutionStatus.RUNNING, workflow=run.workflow
    )
    assert len(changes.events) == 2


def test_a_claim_without_a_lease_gets_the_default_lease() -> None:
    run = make_run([http("fetch")])
    run.claim("fetch", "w1")
    assert run.take_changes().leases == {"fetch": DEFAULT_LEASE_S}
