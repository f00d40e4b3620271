"""The wait step (docs/contract.md#wait): `waiting` with its timeout as `wake_at`, like a
delay, until a resume, an operator's complete or fail, or the timeout ends it.

A resume, complete or fail ends it only while it is `waiting` and its timeout has not
passed; a resume that arrives before the step is ready is kept (`Run.early_resumes`, read
by `load`) and taken the moment the step starts.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from flowforge.domain.kinds.base import Loader, StepKind
from flowforge.domain.model import EventKind, OnTimeout, StepType
from flowforge.domain.model import StepStatus as S

if TYPE_CHECKING:
    from flowforge.domain.definitions import Step
    from flowforge.domain.engine import Run


class WaitKind(StepKind):
    type = StepType.WAIT

    def start(self, run: Run, step: Step) -> None:
        """Start a wait (or take the resume that came early), or end it: its timeout is due."""
        state = run.steps[step.id]
        if state.wake_at is not None:
            time_out(run, step.id)
        elif step.id in run.early_resumes:
            run.changes.applied_resumes.append(step.id)
            run.events.append((step.id, EventKind.WAIT_RESUMED, {"early": True}))
            run.set_step(
                step.id,
                S.SUCCEEDED,
                output=approved(run, step.id, run.early_resumes.pop(step.id), None),
                started_at=run.now,
                reason="resumed before the wait began",
            )
        elif step.event is not None:
            run.open_event_wait(step)
        else:
            assert step.timeout_s is not None
            run.set_step(
                step.id,
                S.WAITING,
                wake_at=run.now + timedelta(seconds=step.timeout_s),
                started_at=run.now,
                reason=f"waiting for a resume, at most {step.timeout_s:g} s",
            )

    def load(self, run: Run, loader: Loader) -> None:
        """The resumes kept for it (docs/contract.md#wait: no lost early resume)."""
        run.early_resumes = loader.early_resumes()
        if any(step.event is not None for step in run.definition.steps):
            # Only a workflow with an event wait reads events (docs/contract.md#events).
            run.event_port = loader.event_port()


def wait_open(run: Run, step_id: str) -> bool:
    """Whether a wait step still takes a resume now: waiting, timeout not passed."""
    state = run.steps[step_id]
    return (
        not run.terminal
        and not run.cancel_requested
        and state.status == S.WAITING
        and state.wake_at is not None
        and state.wake_at > run.now
    )


def wait_not_started(run: Run, step_id: str) -> bool:
    """Whether a resume for this wait step must be kept for later: it is not ready yet."""
    state = run.steps[step_id]
    return (
        not run.terminal
        and not run.cancel_requested
        and state.status in {S.PENDING, S.READY}
        and state.wake_at is None
    )


def resume(run: Run, step_id: str, body: Any, *, actor: dict[str, Any] | None = None) -> None:
    """End an open wait with `body` as its output; the execution goes on."""
    if actor is None:
        run.events.append((step_id, EventKind.WAIT_RESUMED, {}))
    else:
        run.events.append((step_id, EventKind.WAIT_COMPLETED, {"actor": dict(actor)}))
    output = approved(run, step_id, body, actor)
    run.set_step(step_id, S.SUCCEEDED, output=output, wake_at=None, error=None)
    run.advance()


def approved(run: Run, step_id: str, body: Any, actor: dict[str, Any] | None) -> Any:
    """The output of a wait: its resume's body, or for an approval (a wait with a form,
    docs/contract.md#approvals) the form's values with who decided (None: a machine,
    through the resume URL) and when, whichever way it was decided."""
    if run.definition.step(step_id).form is None:
        return body
    return {
        "values": body,
        "decision": "approved",
        "decided_by": actor.get("name") if actor is not None else None,
        "decided_at": run.now.isoformat(),
    }


def fail_wait(run: Run, step_id: str, actor: dict[str, Any]) -> None:
    """An operator says the awaited answer is no: the step fails, and so does the run."""
    run.events.append((step_id, EventKind.WAIT_FAILED, {"actor": dict(actor)}))
    # An approval's reject (docs/contract.md#approvals) says so in the step's error.
    verb = "rejected" if actor.get("decision") == "reject" else "failed"
    run.fail_step(step_id, f"{verb} by {actor.get('name', 'an operator')}")


def time_out(run: Run, step_id: str) -> None:
    """No resume came in time: `on_timeout` decides (`continue` succeeds with null)."""
    step = run.definition.step(step_id)
    reason = f"no resume within {step.timeout_s:g} s"
    run.events.append((step_id, EventKind.WAIT_TIMED_OUT, {"on_timeout": step.on_timeout}))
    if step.on_timeout == OnTimeout.CONTINUE:
        run.set_step(step_id, S.SUCCEEDED, output=None, reason=f"{reason}; continuing")
        run.advance()
    else:
        run.fail_step(step_id, f"timed out: {reason}")


KIND = WaitKind()
