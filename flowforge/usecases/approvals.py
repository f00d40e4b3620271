"""An approval decided (docs/contract.md#approvals): one unit of work, under the execution's
row lock like every other writer, so two people deciding at once are served one after the
other and the second is told the wait is over (409).

Approving checks the values against the step's form first and refuses the whole
submission (422, a JSON path per bad field) before anything is written; then the wait
succeeds with the values, who decided and when as its output, and the execution goes on.
Rejecting fails the step (the run fails as a failed wait does). Both are recorded in the
execution's history with the deciding key as actor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from flowforge.domain.definitions import ApprovalForm, may_decide, require_values
from flowforge.domain.engine import Run
from flowforge.domain.model import StepType
from flowforge.errors import Conflict, Forbidden, NotFound
from flowforge.store.apikeys import ApiKey
from flowforge.store.runs import load_run, save_run, unit_of_work

DECISIONS = ("approve", "reject")


@dataclass(frozen=True)
class Decided:
    """What became of a decision: the step's output (approved) and the execution's status."""

    execution_id: str
    step_id: str
    decision: str
    decided_by: str
    decided_at: str
    status: str
    output: dict[str, Any] | None


def _approval(run: Run, execution_id: str, step_id: str) -> ApprovalForm:
    if step_id not in run.steps:
        raise NotFound(f"execution {execution_id} has no step {step_id!r}")
    step = run.definition.step(step_id)
    if step.type != StepType.WAIT or step.form is None:
        raise NotFound(f"step {step_id!r} of execution {execution_id} is not an approval")
    return step.form


def decide(
    conn: psycopg.Connection,
    execution_id: str,
    step_id: str,
    key: ApiKey,
    decision: str,
    values: Any,
) -> Decided:
    """Approve (with the form's values) or reject an open approval as `key`."""
    with unit_of_work(conn):
        run = load_run(conn, execution_id)
        if run is None:
            raise NotFound(f"execution {execution_id} does not exist")
        form = _approval(run, execution_id, step_id)
        if not may_decide(form, key.name):
            raise Forbidden(f"this approval is assigned to {', '.join(form.assignees)}")
        if not run.wait_open(step_id):
            raise Conflict(
                f"step {step_id!r} is {run.steps[step_id].status}: decided already, "
                "expired or cancelled"
            )
        actor = {**key.actor(), "decision": decision}
        if decision == "approve":
            require_values(form, values, "$.values")
            run.resume(step_id, values, actor=actor)  # its output says who and when
        else:
            run.fail_wait(step_id, actor)
        save_run(conn, run.take_changes())
    output = run.steps[step_id].output if decision == "approve" else None
    return Decided(
        execution_id, step_id, decision, key.name, run.now.isoformat(), str(run.status), output
    )
