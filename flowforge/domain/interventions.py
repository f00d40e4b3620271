"""What operators and time limits do to a run: cancel and its flow-control forms
(deadline, queue expiry, cancel_oldest), retry, resolve, and pause and resume
(docs/contract.md#outcomes-stick, #pause, #flow-control). Each is a function over a `Run`
that the core (flowforge/domain/engine.py) offers as a method of the same name, so the
store's units of work and domain/operations.py call `run.cancel(actor=...)` as before.

What they do to steps (no operator action silently repeats an unsafe request):

- A `succeeded` step stays `succeeded`, and an `unknown` step stays `unknown` until an
  operator resolves it, whatever happens to the execution: cancel and retry never touch
  either.
- Cancel stops `pending`, `ready` and `waiting` steps at once (`cancelled`). A `running`
  step is left to finish: its attempt is recorded as it ends — a success makes the step
  `succeeded` (the remote effect happened and is kept), an unknown result makes it
  `unknown`, a failure makes it `cancelled` with no retry scheduled. When its worker dies
  instead, the reaper recovers it as for any lost lease, except that a safe request is not
  tried again: `cancelled` when repeating is safe, `unknown` when it is not. The
  execution is `cancelled` once nothing runs, even when a step is left `unknown`; the
  `needs_attention` listing still finds it.
- A deadline (docs/contract.md#deadline) stops the execution like a cancel, except that it
  ends `failed` with reason `deadline`; a queue expiry (`start_within_s`) and
  `cancel_oldest` end it `cancelled` with reason `expired` and `concurrency`. Each reason
  is in the history.
- Retry re-runs `failed` and `cancelled` steps only. An `unknown` step is re-sent only
  after an operator resolved it as failed (a human said it did not happen) and then asked
  for a retry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowforge.domain.model import (
    CANCELLABLE_STEP,
    FLOW_CONTROL_ACTOR,
    PAUSABLE,
    RETRIED_STEP,
    WORKFLOW_PAUSE_ACTOR,
    AttemptOutcome,
    EventKind,
    OnExhausted,
    PauseReason,
    StopReason,
    execution_event,
    transition,
)
from flowforge.domain.model import ExecutionStatus as E
from flowforge.domain.model import StepStatus as S

if TYPE_CHECKING:
    from flowforge.domain.engine import Run


def cancel(run: Run, *, actor: dict[str, Any]) -> None:
    """Stop queued and waiting work now; running steps stop at their next boundary.

    `unknown` steps are left alone: cancelling does not settle what a remote system did.
    """
    stop(run, None, "execution cancelled", actor=actor)


def stop(run: Run, reason: StopReason | None, error: str, *, actor: dict[str, Any]) -> None:
    """Cancel with a reason (`concurrency`, `deadline`, `expired`) kept in the history,
    with who asked for it."""
    requested: dict[str, Any] = {"actor": dict(actor)}
    if reason is not None:
        requested["reason"] = reason
    run.events.append((None, EventKind.CANCEL_REQUESTED, requested))
    run.cancel_requested = True
    run.stop_reason = reason
    run.forget_pause()
    # cancel_requested_at must be saved even if the status holds.
    run.changes.execution_changed = True
    for step_id in run.row_ids():
        if run.steps[step_id].status in CANCELLABLE_STEP:
            run.set_step(step_id, S.CANCELLED, error=error, reason=reason)
    run.derive_status()


def pass_deadline(run: Run, *, actor: dict[str, Any] = FLOW_CONTROL_ACTOR) -> None:
    """deadline_s passed: nothing new starts, queued and waiting work stops, a request in
    flight finishes and is recorded; the execution ends `failed` (reason `deadline`)."""
    limit = run.definition.deadline_s
    run.events.append((None, EventKind.DEADLINE_PASSED, {"deadline_s": limit}))
    stop(
        run,
        StopReason.DEADLINE,
        f"not run: the execution's deadline_s {limit} passed",
        actor=actor,
    )


def expire(run: Run, *, actor: dict[str, Any] = FLOW_CONTROL_ACTOR) -> None:
    """start_within_s passed while still queued: the execution ends `cancelled` (expired)."""
    limit = run.definition.start_within_s
    stop(
        run,
        StopReason.EXPIRED,
        f"not run: not started within start_within_s {limit}",
        actor=actor,
    )


def enforce_time_limits(run: Run) -> None:
    """Apply a deadline or queue expiry that is due and not applied yet (the timer
    scanner applies them too; this keeps a worker from starting work past them)."""
    if run.terminal or run.cancel_requested:
        return
    if run.deadline_passed:
        pass_deadline(
            run,
        )
    elif run.expired and (run.status == E.QUEUED or run.paused_from == E.QUEUED):
        # Paused while it waited in the queue: start_within_s still applies.
        expire(
            run,
        )


def retry(run: Run, *, actor: dict[str, Any]) -> list[str]:
    """Re-run failed and cancelled steps, keeping every succeeded checkpoint; returns them.

    `unknown` steps keep their status: re-sending a request whose effect is unknown is
    a decision an operator makes by resolving the step first.
    """
    run.load_all()
    run.cancel_requested = False
    run.stop_reason = None
    rerun = [row for row in run.row_ids() if run.steps[row].status in RETRIED_STEP]
    for step_id in rerun:
        # A resume kept for a wait of the last round does not carry over to the new one
        # (actions.retry deletes its row).
        run.early_resumes.pop(step_id, None)
        run.set_step(
            step_id,
            S.PENDING,
            attempts=0,
            # A new round: a retried wait step reopens under a new resume URL
            # (flowforge/store/waits.py), and any late write of the old round is fenced off.
            fencing_token=run.steps[step_id].fencing_token + 1,
            error=None,
            wake_at=None,
            output=None,
            started_at=None,  # budget_s counts from the first attempt of this run
            finished_at=None,
        )
    run.status = E.RUNNING
    run.changes.execution_changed = True
    retried: dict[str, Any] = {"steps": [row for row in rerun if "[" not in row]}
    if len(retried["steps"]) < len(rerun):
        # A map's items: how many of their steps run again, not thousands of ids.
        retried["item_steps"] = len(rerun) - len(retried["steps"])
    run.events.append((None, EventKind.EXECUTION_RETRIED, {**retried, "actor": dict(actor)}))
    run.advance()
    return rerun


def resolve(run: Run, step_id: str, outcome: str, output: Any, *, actor: dict[str, Any]) -> None:
    """An operator's verdict on a step whose remote effect was unknown."""
    run.load_all()
    resolved = {"outcome": outcome, "actor": dict(actor)}
    if outcome == AttemptOutcome.SUCCEEDED:
        run.set_step(step_id, S.SUCCEEDED, output=output, error=None)
        run.events.append((step_id, EventKind.STEP_RESOLVED, resolved))
        run.advance()
    else:
        run.events.append((step_id, EventKind.STEP_RESOLVED, resolved))
        run.fail_step(step_id, f"resolved as failed by {actor.get('name', 'an operator')}")
        run.derive_status()


def hold(run: Run) -> bool:
    """Whether nothing may start or continue now: the execution is paused, or its
    workflow is — which pauses it here, the first time a worker touches it."""
    if run.terminal or run.cancel_requested:
        return False
    if run.workflow_paused_by is not None and not run.paused:
        pause(run, PauseReason.WORKFLOW, actor=run.workflow_paused_by or WORKFLOW_PAUSE_ACTOR)
    return run.paused


def pause(
    run: Run, reason: PauseReason, *, actor: dict[str, Any], detail: dict[str, Any] | None = None
) -> None:
    """Hold the execution: ready steps are not claimed, nothing new is promoted, a
    request in flight finishes and is recorded. A paused one stays as it is."""
    if run.paused or run.terminal or run.cancel_requested:
        return
    run.paused_from = run.status if run.status in PAUSABLE else E.RUNNING
    run.pause_reason = reason
    entry = {**transition(run.status, E.PAUSED), "reason": reason, "actor": dict(actor)}
    run.events.append((None, execution_event(E.PAUSED), {**entry, **(detail or {})}))
    run.status = E.PAUSED
    run.changes.execution_changed = True


def pause_exhausted(run: Run, step_id: str, error: str) -> None:
    """retry.on_exhausted "pause": the step's tries ran out; it is `failed` but nothing
    else is stopped, and the execution waits, paused, for an operator."""
    run.set_step(step_id, S.FAILED, error=error, lease_owner=None)
    pause(run, PauseReason.EXHAUSTED, actor=FLOW_CONTROL_ACTOR, detail={"step": step_id})
    run.derive_status()


def unpause(run: Run, *, actor: dict[str, Any]) -> list[str]:
    """Resume a paused execution: steps whose tries ran out run again (a fresh set of
    tries), ready steps are dispatched again, and it goes on as it was. One that was
    queued for a slot goes back to its place in the queue (the caller fills slots).
    Returns the steps run again."""
    run.load_all()
    was = run.paused_from or E.RUNNING
    rerun = [row for row in run.row_ids() if _tries_ran_out(run, row)]
    for step_id in rerun:
        run.set_step(
            step_id,
            S.READY,
            attempts=0,
            error=None,
            wake_at=None,
            started_at=None,  # budget_s counts from the first attempt of this run
            finished_at=None,
        )
    run.events.append((None, EventKind.EXECUTION_RESUMED, {"actor": dict(actor), "steps": rerun}))
    run.forget_pause()
    run.changes.execution_changed = True
    if was == E.QUEUED:
        run.events.append((None, execution_event(E.QUEUED), transition(E.PAUSED, E.QUEUED)))
        run.status = E.QUEUED
        if run.concurrency_key is not None and not run.held_slot:
            return rerun
    for step_id in run.row_ids():
        state = run.steps[step_id]
        ready = state.status == S.READY
        if ready and not run.kind_of(state.type).pure and step_id not in run.dispatch:
            run.dispatch.append(step_id)
    run.advance()
    return rerun


def _tries_ran_out(run: Run, step_id: str) -> bool:
    """Whether a step is `failed` because its tries ran out under `on_exhausted:
    pause` — what a resume runs again. Not any failed step: a map's item that failed
    for good (a 4xx, a 503 to an unsafe POST, no retry policy) leaves the map and its
    execution running under `collect`, so the execution can be paused and resumed
    with it failed, and running it again would re-send an unsafe request nobody asked
    for (soak seed 2344)."""
    state = run.steps[step_id]
    if state.status != S.FAILED:
        return False
    policy = run.definition.step(step_id).retry
    return policy.on_exhausted == OnExhausted.PAUSE and state.attempts >= policy.max_attempts


def fail_paused(run: Run, *, actor: dict[str, Any]) -> None:
    """An operator gives up on an execution paused at a step whose tries ran out: it
    fails as it would have under on_exhausted "fail"."""
    run.load_all()
    failed = [row for row in run.row_ids() if run.steps[row].status == S.FAILED]
    name = actor.get("name", "an operator")
    run.events.append((None, EventKind.FAIL_REQUESTED, {"actor": dict(actor)}))
    if failed:
        # An item's failure is settled by its map, which a pause would hold.
        run.forget_pause()
        run.changes.execution_changed = True
    for step_id in failed:
        error = run.steps[step_id].error or "failed"
        run.fail_step(step_id, f"{error}; failed by {name} while paused")
