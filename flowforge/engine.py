"""DAG progression of one execution, as pure Python over its loaded rows.

Every change to an execution happens in a unit of work: load the execution and its steps
under the execution row lock, change a `Run` in memory, save what changed in the same
transaction. Keeping the rules here, free of SQL and I/O, lets the worker, the reaper,
the timer scanner and operator actions share one set of transitions, and lets unit tests
drive them without a database.

What operator actions do to steps (SPEC §7: no operator action silently repeats an
unsafe request):

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
- A deadline (SPEC §8) stops the execution like a cancel, except that it ends `failed`
  with reason `deadline`; a queue expiry (`start_within_s`) and `cancel_oldest` end it
  `cancelled` with reason `expired` and `concurrency`. Each reason is in the history.
- A `wait` step is `waiting` with its timeout as `wake_at`, like a delay: cancel stops it
  at once. A resume, or an operator's complete or fail, ends it only while it is
  `waiting` and its timeout has not passed; a resume that arrives before the step is
  ready is kept (`early_resumes`) and taken the moment the step starts.
- Retry re-runs `failed` and `cancelled` steps only. An `unknown` step is re-sent only
  after an operator resolved it as failed (a human said it did not happen) and then asked
  for a retry.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from flowforge.definitions import Definition, RetryPolicy, Step, parse_until
from flowforge.model import (
    DEFAULT_LEASE_S,
    FLOW_CONTROL_ACTOR,
    TERMINAL_EXECUTION,
    WORKFLOW_PAUSE_ACTOR,
    AttemptOutcome,
    EventKind,
    Outcome,
    PauseReason,
    execution_event,
    step_event,
    transition,
)
from flowforge.model import ExecutionStatus as E
from flowforge.model import StepStatus as S
from flowforge.templating import TemplateError, evaluate_condition, render

DONE_STEP = frozenset({S.SUCCEEDED, S.SKIPPED})
FINAL_STEP = frozenset({S.SUCCEEDED, S.FAILED, S.SKIPPED, S.CANCELLED})
# Steps that may still change without an operator: they keep an execution alive.
ACTIVE_STEP = frozenset({S.READY, S.RUNNING, S.WAITING})
# Cancel stops these at once; `running` steps stop at their next boundary.
CANCELLABLE_STEP = frozenset({S.PENDING, S.READY, S.WAITING})
# An operator retry re-runs these; `succeeded` and `unknown` are never reset.
RETRIED_STEP = frozenset({S.FAILED, S.CANCELLED})
# Steps the worker may run inside the checkpoint transaction: no remote effect, no lease.
PURE_TYPES = frozenset({"transform", "delay", "wait"})
# What a paused execution was (and resume gives back), SPEC §14.
PAUSABLE_EXECUTION = frozenset({E.QUEUED, E.RUNNING, E.WAITING, E.NEEDS_ATTENTION})


def _describe(condition: dict[str, Any]) -> str:
    """A `when` as one reads it: `shape.total gt 100`."""
    if condition["op"] == "exists":
        return f"{condition['path']} exists"
    return f"{condition['path']} {condition['op']} {json.dumps(condition['value'])}"


@dataclass
class StepState:
    """One row of `steps` as loaded; `lease_expired` says whether a running step's lease had
    run out by the transaction's now() when it was loaded (what the reaper acts on)."""

    step_id: str
    type: str
    status: str
    attempts: int = 0
    fencing_token: int = 0
    wake_at: datetime | None = None
    output: Any = None
    error: str | None = None
    lease_owner: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lease_expired: bool = False


@dataclass
class NewAttempt:
    """An attempt row to insert; `outcome` None means it is in flight."""

    step_id: str
    fencing_token: int
    worker: str | None
    outcome: str | None = None
    error: str | None = None
    http_status: int | None = None
    duration_ms: int | None = None
    request: dict[str, Any] | None = None  # what an http_request sends (Rendered.record)


@dataclass
class FinishedAttempt:
    """An in-flight attempt row to close, matched by its step and fencing token."""

    step_id: str
    fencing_token: int
    outcome: str
    error: str | None = None
    http_status: int | None = None
    duration_ms: int | None = None
    response: dict[str, Any] | None = None  # what came back, if anything (Outcome.response)


@dataclass
class Changes:
    """What one unit of work changed: everything `runs.save_run` writes, as a value the
    engine hands over (Run.take_changes), so saving never reaches back into the run."""

    execution_id: str
    events: list[tuple[str | None, str, dict[str, Any]]] = field(default_factory=list)
    dispatch: list[str] = field(default_factory=list)
    new_attempts: list[NewAttempt] = field(default_factory=list)
    finished_attempts: list[FinishedAttempt] = field(default_factory=list)
    # The changed steps, by id, and the lease (seconds) of each one claimed.
    steps: dict[str, StepState] = field(default_factory=dict)
    leases: dict[str, float] = field(default_factory=dict)
    # Whether the execution row changed, and what it is now (set by take_changes).
    execution_changed: bool = False
    status: str = ""
    cancel_requested: bool = False
    stop_reason: str | None = None
    # The concurrency slot this unit of work freed (SPEC §8): runs.save_run hands it to
    # the next queued execution of the key in the same transaction.
    released_slot: tuple[int, str] | None = None
    # Wait steps that took their early resume: saving marks those resumes applied.
    applied_resumes: list[str] = field(default_factory=list)
    # SPEC §14: what a paused execution was, and why it is paused (None: not paused).
    paused_from: str | None = None
    pause_reason: str | None = None
    # For the spans written after the commit (flowforge/tracing.py).
    workflow: str = ""
    traceparent: str | None = None


@dataclass
class Run:
    """An execution under its row lock: the state every transition reads and changes.

    What changed is logged in `changes` until take_changes() hands it over for saving.
    """

    execution_id: str
    workflow: str
    version: int
    status: str
    input: Any
    definition: Definition
    steps: dict[str, StepState]
    now: datetime
    cancel_requested: bool = False
    # Flow control (SPEC §8): why a stop was asked, the execution's concurrency key and
    # whether it held a slot when loaded (a slot frees when it ends or is asked to stop),
    # and whether its deadline or queue expiry had passed by the transaction's now().
    stop_reason: str | None = None
    workflow_id: int = 0
    concurrency_key: str | None = None
    held_slot: bool = False
    deadline_passed: bool = False
    expired: bool = False
    # Resumes recorded before their wait step was ready (step id -> body); loaded only for
    # workflows with wait steps, taken (Changes.applied_resumes) when the step starts.
    early_resumes: dict[str, Any] = field(default_factory=dict)
    # Pause (SPEC §14): what the execution was when paused and why (both None unless it
    # is `paused`), and whether its workflow is paused, by whom (the actor of the pause).
    paused_from: str | None = None
    pause_reason: str | None = None
    workflow_paused_by: dict[str, Any] | None = None
    # The webhook's trace context, stored at intake (flowforge/tracing.py); None if none.
    traceparent: str | None = None
    changes: Changes = field(init=False)

    def __post_init__(self) -> None:
        self.changes = Changes(self.execution_id)

    # ---- the change log ------------------------------------------------------------

    @property
    def events(self) -> list[tuple[str | None, str, dict[str, Any]]]:
        """History entries to append: (step id or None, kind, detail)."""
        return self.changes.events

    @property
    def dispatch(self) -> list[str]:
        """Steps made ready that need a wake-up message."""
        return self.changes.dispatch

    @property
    def new_attempts(self) -> list[NewAttempt]:
        """Attempt rows to insert."""
        return self.changes.new_attempts

    @property
    def finished_attempts(self) -> list[FinishedAttempt]:
        """In-flight attempt rows to close."""
        return self.changes.finished_attempts

    def take_changes(self) -> Changes:
        """Hand over what changed since the last call, and start an empty change log."""
        changes, self.changes = self.changes, Changes(self.execution_id)
        changes.status = self.status
        changes.cancel_requested = self.cancel_requested
        changes.stop_reason = self.stop_reason
        changes.paused_from = self.paused_from
        changes.pause_reason = self.pause_reason
        changes.workflow, changes.traceparent = self.workflow, self.traceparent
        if self.releases_slot and self.concurrency_key is not None:
            changes.released_slot = (self.workflow_id, self.concurrency_key)
            self.held_slot = False
        return changes

    # ---- reading -------------------------------------------------------------------

    def context(self, step_id: str) -> dict[str, Any]:
        """Template context of a step: input, execution, and its finished ancestors."""
        ctx: dict[str, Any] = {
            "input": self.input,
            "execution": {
                "id": self.execution_id,
                "workflow": self.workflow,
                "version": self.version,
            },
        }
        for ancestor in self.definition.ancestors(step_id):
            state = self.steps[ancestor]
            if state.status == S.SUCCEEDED:
                ctx[ancestor] = state.output
        return ctx

    @property
    def terminal(self) -> bool:
        """Whether the execution has finished for good."""
        return self.status in TERMINAL_EXECUTION

    @property
    def paused(self) -> bool:
        """Whether the execution is paused (SPEC §14): nothing of it starts or continues.
        Read from the reason, which resume clears before the status is derived again."""
        return self.pause_reason is not None

    @property
    def releases_slot(self) -> bool:
        """Whether the concurrency slot the execution held is free now."""
        return self.held_slot and (self.terminal or self.cancel_requested)

    def budget_left(self, step_id: str) -> float | None:
        """Seconds left of a step's `budget_s`, counted from its first attempt; None: no budget."""
        budget = self.definition.step(step_id).budget_s
        state = self.steps[step_id]
        if budget is None:
            return None
        started = state.started_at or self.now
        return (started + timedelta(seconds=budget) - self.now).total_seconds()

    def attempt_timeout(self, step_id: str, timeout_s: float) -> float:
        """An attempt's timeout, shrunk to what is left of the step's budget."""
        left = self.budget_left(step_id)
        if left is None:
            return timeout_s
        # Never zero: a claimed attempt still gets a moment to fail cleanly.
        return max(min(timeout_s, left), 0.1)

    # ---- writing -------------------------------------------------------------------

    def set_step(
        self, step_id: str, status: str, *, reason: str | None = None, **fields: Any
    ) -> None:
        """Change a step and append the transition (with `reason`, if given) to the history."""
        state = self.steps[step_id]
        previous = state.status
        state.status = status
        for name, value in fields.items():
            setattr(state, name, value)
        if status in FINAL_STEP | {S.UNKNOWN} and state.finished_at is None:
            state.finished_at = self.now
        self.changes.steps[step_id] = state
        detail = transition(previous, status)
        if state.error and status in {S.FAILED, S.UNKNOWN, S.WAITING, S.CANCELLED}:
            detail["error"] = state.error
        if reason is not None:
            detail["reason"] = reason
        self.events.append((step_id, step_event(status), detail))

    def advance(self) -> None:
        """Promote steps whose parents are done and run pure steps until nothing moves.

        Pure steps run here, inside the checkpoint transaction that made them ready, so a
        chain of transforms costs one commit instead of a broker round trip per step.
        """
        if self.cancel_requested or self.terminal:
            self.derive_status()
            return
        if self.hold():
            self.derive_status()
            return
        moved = True
        while moved:
            moved = False
            for step in self.definition.steps:
                state = self.steps[step.id]
                if state.status == S.PENDING and self._promote(step):
                    moved = True
                if self.steps[step.id].status == S.READY and step.type in PURE_TYPES:
                    self._run_pure(step)
                    moved = True
        self.derive_status()

    def _promote(self, step: Step) -> bool:
        parents = [self.steps[p] for p in step.depends_on]
        if not all(p.status in DONE_STEP for p in parents):
            return False
        if parents and all(p.status == S.SKIPPED for p in parents):
            self.set_step(step.id, S.SKIPPED, reason="every step it depends on was skipped")
            return True
        self.set_step(step.id, S.READY)
        if step.type not in PURE_TYPES:
            self.dispatch.append(step.id)
        return True

    def _run_pure(self, step: Step) -> None:
        """Evaluate `when`, then run a transform or start/finish a delay."""
        state = self.steps[step.id]
        if state.wake_at is None and not self._when_allows(step):
            return
        if step.type == "wait":
            self._run_wait(step)
        elif step.type == "transform":
            try:
                output = render(step.output, self.context(step.id))
            except TemplateError as exc:
                self._record_pure_attempt(step.id, AttemptOutcome.FAILED, str(exc))
                self.fail_step(step.id, str(exc))
                return
            self._record_pure_attempt(step.id, AttemptOutcome.SUCCEEDED)
            self.set_step(step.id, S.SUCCEEDED, output=output, started_at=self.now)
        elif state.wake_at is None:
            try:
                wake_at = self._delay_until(step)
            except (TemplateError, ValueError) as exc:
                self.fail_step(step.id, f"delay: {exc}")
                return
            if wake_at <= self.now:
                self.set_step(
                    step.id,
                    S.SUCCEEDED,
                    wake_at=wake_at,
                    started_at=self.now,
                    output={"waited_until": wake_at.isoformat()},
                )
            else:
                self.set_step(step.id, S.WAITING, wake_at=wake_at, started_at=self.now)
        else:
            # The timer scanner made it ready: the wait is over.
            self.set_step(step.id, S.SUCCEEDED, output={"waited_until": state.wake_at.isoformat()})

    def _run_wait(self, step: Step) -> None:
        """Start a wait (or take the resume that came early), or end it: its timeout is due."""
        state = self.steps[step.id]
        if state.wake_at is not None:
            self.time_out(step.id)
        elif step.id in self.early_resumes:
            self.changes.applied_resumes.append(step.id)
            self.events.append((step.id, EventKind.WAIT_RESUMED, {"early": True}))
            self.set_step(
                step.id,
                S.SUCCEEDED,
                output=self.early_resumes.pop(step.id),
                started_at=self.now,
                reason="resumed before the wait began",
            )
        else:
            assert step.timeout_s is not None
            self.set_step(
                step.id,
                S.WAITING,
                wake_at=self.now + timedelta(seconds=step.timeout_s),
                started_at=self.now,
                reason=f"waiting for a resume, at most {step.timeout_s:g} s",
            )

    def wait_open(self, step_id: str) -> bool:
        """Whether a wait step still takes a resume now: waiting, timeout not passed."""
        state = self.steps[step_id]
        return (
            not self.terminal
            and not self.cancel_requested
            and state.status == S.WAITING
            and state.wake_at is not None
            and state.wake_at > self.now
        )

    def wait_not_started(self, step_id: str) -> bool:
        """Whether a resume for this wait step must be kept for later: it is not ready yet."""
        state = self.steps[step_id]
        return (
            not self.terminal
            and not self.cancel_requested
            and state.status in {S.PENDING, S.READY}
            and state.wake_at is None
        )

    def resume(self, step_id: str, body: Any, *, actor: dict[str, Any] | None = None) -> None:
        """End an open wait with `body` as its output; the execution goes on."""
        if actor is None:
            self.events.append((step_id, EventKind.WAIT_RESUMED, {}))
        else:
            self.events.append((step_id, EventKind.WAIT_COMPLETED, {"actor": dict(actor)}))
        self.set_step(step_id, S.SUCCEEDED, output=body, wake_at=None, error=None)
        self.advance()

    def fail_wait(self, step_id: str, actor: dict[str, Any]) -> None:
        """An operator says the awaited answer is no: the step fails, and so does the run."""
        self.events.append((step_id, EventKind.WAIT_FAILED, {"actor": dict(actor)}))
        self.fail_step(step_id, f"failed by {actor.get('name', 'an operator')}")

    def time_out(self, step_id: str) -> None:
        """No resume came in time: `on_timeout` decides (`continue` succeeds with null)."""
        step = self.definition.step(step_id)
        reason = f"no resume within {step.timeout_s:g} s"
        self.events.append((step_id, EventKind.WAIT_TIMED_OUT, {"on_timeout": step.on_timeout}))
        if step.on_timeout == "continue":
            self.set_step(step_id, S.SUCCEEDED, output=None, reason=f"{reason}; continuing")
            self.advance()
        else:
            self.fail_step(step_id, f"timed out: {reason}")

    def _when_allows(self, step: Step) -> bool:
        if step.when is None:
            return True
        try:
            allowed = evaluate_condition(step.when, self.context(step.id))
        except TemplateError as exc:
            self.fail_step(step.id, f"when: {exc}")
            return False
        if not allowed:
            self.set_step(step.id, S.SKIPPED, reason=f"when {_describe(step.when)} is false")
        return allowed

    def _delay_until(self, step: Step) -> datetime:
        if step.duration_s is not None:
            return self.now + timedelta(seconds=step.duration_s)
        assert step.until is not None
        rendered = render(step.until, self.context(step.id))
        if not isinstance(rendered, str):
            raise ValueError("until must render to an ISO-8601 timestamp string")
        return parse_until(rendered)

    def _record_pure_attempt(self, step_id: str, outcome: str, error: str | None = None) -> None:
        state = self.steps[step_id]
        state.attempts += 1
        self.new_attempts.append(NewAttempt(step_id, state.fencing_token, None, outcome, error))

    def when_allows(self, step_id: str) -> bool:
        """Check a ready non-pure step's `when` before it is claimed; skips it if false."""
        allowed = self._when_allows(self.definition.step(step_id))
        if not allowed:
            self.advance()
        return allowed

    def fail_step(self, step_id: str, error: str) -> None:
        """Fail a step and stop everything that has not started: a failure fails the run,
        paused or not (a request that was in flight when it was paused ends it too)."""
        self._forget_pause()
        self.set_step(step_id, S.FAILED, error=error, lease_owner=None)
        for other in self.definition.steps:
            state = self.steps[other.id]
            if state.status in CANCELLABLE_STEP:
                self.set_step(other.id, S.CANCELLED, error=f"not run: step {step_id} failed")
        self.derive_status()

    def record_outcome(self, step_id: str, token: int, outcome: Outcome) -> None:
        """Checkpoint one attempt of a claimed step: its attempt row, the step, what follows."""
        self.finish_attempt(
            step_id,
            token,
            outcome.attempt_outcome,
            error=outcome.error,
            http_status=outcome.http_status,
            duration_ms=outcome.duration_ms,
            response=outcome.response,
        )
        policy = self.definition.step(step_id).retry
        if outcome.output is not None:
            # A failed response is kept too: it is what an operator needs to see.
            self.steps[step_id].output = outcome.output
        if outcome.kind == "succeeded":
            self.succeed(step_id, outcome.output)
        elif outcome.kind == "unknown":
            self.mark_unknown(step_id, outcome.error or "remote effect unknown")
        elif self.cancel_requested:
            self.set_step(step_id, S.CANCELLED, error=outcome.error, lease_owner=None)
            self.derive_status()
        elif outcome.kind == "retry" and self.retry_later(
            step_id, policy, outcome.error or "failed", outcome.retry_after_s
        ):
            return
        elif outcome.kind == "retry" and policy.on_exhausted == "pause":
            self.pause_exhausted(step_id, outcome.error or "failed")
        else:
            self.fail_step(step_id, outcome.error or "failed")

    def claim(
        self,
        step_id: str,
        worker: str,
        lease_s: float = DEFAULT_LEASE_S,
        request: dict[str, Any] | None = None,
    ) -> StepState:
        """Take a ready step for `lease_s` seconds: new fencing token, new attempt row
        (committed before any I/O, with the request about to be sent)."""
        state = self.steps[step_id]
        self.changes.leases[step_id] = lease_s
        state.fencing_token += 1
        state.attempts += 1
        self.set_step(
            step_id, S.RUNNING, lease_owner=worker, started_at=state.started_at or self.now
        )
        self.new_attempts.append(NewAttempt(step_id, state.fencing_token, worker, request=request))
        self.derive_status()
        return state

    def finish_attempt(self, step_id: str, token: int, outcome: str, **fields: Any) -> None:
        """Close the in-flight attempt that holds `token`."""
        self.finished_attempts.append(FinishedAttempt(step_id, token, outcome, **fields))

    def recover_lease(self, step_id: str) -> None:
        """A running step's owner vanished: repeat it when safe, otherwise say unknown."""
        state = self.steps[step_id]
        step = self.definition.step(step_id)
        error = f"lease of {state.lease_owner or 'a worker'} expired mid-attempt"
        if step.repeat_safe:
            self.finish_attempt(
                step_id, state.fencing_token, AttemptOutcome.LOST_LEASE, error=error
            )
            if self.cancel_requested:
                self.set_step(step_id, S.CANCELLED, error=error, lease_owner=None)
                self.derive_status()
            elif self.retry_later(step_id, step.retry, error):
                pass
            elif step.retry.on_exhausted == "pause":
                self.pause_exhausted(step_id, error)
            else:
                self.fail_step(step_id, error)
        else:
            self.finish_attempt(
                step_id,
                state.fencing_token,
                AttemptOutcome.UNKNOWN,
                error=f"{error}; the request may have been sent",
            )
            self.mark_unknown(
                step_id, f"{error}; the request may have been sent and is not safe to repeat"
            )

    def succeed(self, step_id: str, output: Any) -> None:
        """Record a step's result, cancelled run or not: what happened remotely stays true.

        After a cancel, advance() starts nothing downstream of it.
        """
        self.set_step(step_id, S.SUCCEEDED, output=output, lease_owner=None)
        self.advance()

    def retry_later(
        self, step_id: str, policy: RetryPolicy, error: str, retry_after_s: float | None = None
    ) -> bool:
        """Schedule another try as `waiting` with back-off; False when no tries are left.

        Past the step's budget_s it fails the step at once, saying why (True: handled)."""
        state = self.steps[step_id]
        if state.attempts >= policy.max_attempts:
            return False
        delay = backoff_seconds(policy, state.attempts)
        if retry_after_s is not None:
            delay = min(max(delay, retry_after_s), policy.max_interval_s)
        spent = self._budget_spent(step_id, delay, retry_after_s)
        if spent is not None:
            self.fail_step(step_id, f"{error}; {spent}")
            return True
        self.set_step(
            step_id,
            S.WAITING,
            wake_at=self.now + timedelta(seconds=delay),
            error=error,
            lease_owner=None,
        )
        self.derive_status()
        return True

    def _budget_spent(self, step_id: str, delay: float, retry_after_s: float | None) -> str | None:
        """Why no retry may be scheduled within the step's budget_s, or None."""
        left = self.budget_left(step_id)
        if left is None:
            return None
        budget = self.definition.step(step_id).budget_s
        if retry_after_s is not None and retry_after_s > left:
            return (
                f"not retried: Retry-After {retry_after_s:g} s is beyond what is left of "
                f"budget_s {budget:g} ({max(left, 0):.1f} s)"
            )
        if delay >= left:
            return (
                f"not retried: the next try ({delay:.1f} s from now) would start after "
                f"budget_s {budget:g} ran out ({max(left, 0):.1f} s left)"
            )
        return None

    def correct_never_sent(self, step_id: str, error: str) -> None:
        """The fence kept an attempt's request home after the reaper had already recorded
        it `unknown` (its worker was frozen past the lease): it provably never left, so the
        step is retried like any attempt that was not sent, not left to an operator."""
        policy = self.definition.step(step_id).retry
        if self.cancel_requested:
            self.set_step(step_id, S.CANCELLED, error=error, lease_owner=None)
            self.derive_status()
        elif not self.retry_later(step_id, policy, error):
            self.fail_step(step_id, error)

    def mark_unknown(self, step_id: str, error: str) -> None:
        """The remote effect cannot be known: an operator has to decide."""
        self.set_step(step_id, S.UNKNOWN, error=error, lease_owner=None)
        self.derive_status()

    def cancel(self, *, actor: dict[str, Any]) -> None:
        """Stop queued and waiting work now; running steps stop at their next boundary.

        `unknown` steps are left alone: cancelling does not settle what a remote system did.
        """
        self.stop(None, "execution cancelled", actor=actor)

    def stop(self, reason: str | None, error: str, *, actor: dict[str, Any]) -> None:
        """Cancel with a reason (`concurrency`, `deadline`, `expired`) kept in the history,
        with who asked for it."""
        requested: dict[str, Any] = {"actor": dict(actor)}
        if reason is not None:
            requested["reason"] = reason
        self.events.append((None, EventKind.CANCEL_REQUESTED, requested))
        self.cancel_requested = True
        self.stop_reason = reason
        self._forget_pause()
        # cancel_requested_at must be saved even if the status holds.
        self.changes.execution_changed = True
        for step in self.definition.steps:
            if self.steps[step.id].status in CANCELLABLE_STEP:
                self.set_step(step.id, S.CANCELLED, error=error, reason=reason)
        self.derive_status()

    def pass_deadline(self, *, actor: dict[str, Any] = FLOW_CONTROL_ACTOR) -> None:
        """deadline_s passed: nothing new starts, queued and waiting work stops, a request in
        flight finishes and is recorded; the execution ends `failed` (reason `deadline`)."""
        limit = self.definition.deadline_s
        self.events.append((None, EventKind.DEADLINE_PASSED, {"deadline_s": limit}))
        self.stop(
            "deadline",
            f"not run: the execution's deadline_s {limit} passed",
            actor=actor,
        )

    def expire(self, *, actor: dict[str, Any] = FLOW_CONTROL_ACTOR) -> None:
        """start_within_s passed while still queued: the execution ends `cancelled` (expired)."""
        limit = self.definition.start_within_s
        self.stop(
            "expired",
            f"not run: not started within start_within_s {limit}",
            actor=actor,
        )

    def enforce_time_limits(self) -> None:
        """Apply a deadline or queue expiry that is due and not applied yet (the timer
        scanner applies them too; this keeps a worker from starting work past them)."""
        if self.terminal or self.cancel_requested:
            return
        if self.deadline_passed:
            self.pass_deadline()
        elif self.expired and (self.status == E.QUEUED or self.paused_from == E.QUEUED):
            # Paused while it waited in the queue: start_within_s still applies.
            self.expire()

    def retry(self, *, actor: dict[str, Any]) -> list[str]:
        """Re-run failed and cancelled steps, keeping every succeeded checkpoint; returns them.

        `unknown` steps keep their status: re-sending a request whose effect is unknown is
        a decision an operator makes by resolving the step first.
        """
        self.cancel_requested = False
        self.stop_reason = None
        rerun = [s.id for s in self.definition.steps if self.steps[s.id].status in RETRIED_STEP]
        for step_id in rerun:
            # A resume kept for a wait of the last round does not carry over to the new one
            # (actions.retry deletes its row).
            self.early_resumes.pop(step_id, None)
            self.set_step(
                step_id,
                S.PENDING,
                attempts=0,
                # A new round: a retried wait step reopens under a new resume URL
                # (flowforge/waits.py), and any late write of the old round is fenced off.
                fencing_token=self.steps[step_id].fencing_token + 1,
                error=None,
                wake_at=None,
                output=None,
                started_at=None,  # budget_s counts from the first attempt of this run
                finished_at=None,
            )
        self.status = E.RUNNING
        self.changes.execution_changed = True
        self.events.append(
            (None, EventKind.EXECUTION_RETRIED, {"steps": rerun, "actor": dict(actor)})
        )
        self.advance()
        return rerun

    def resolve(self, step_id: str, outcome: str, output: Any, *, actor: dict[str, Any]) -> None:
        """An operator's verdict on a step whose remote effect was unknown."""
        resolved = {"outcome": outcome, "actor": dict(actor)}
        if outcome == AttemptOutcome.SUCCEEDED:
            self.set_step(step_id, S.SUCCEEDED, output=output, error=None)
            self.events.append((step_id, EventKind.STEP_RESOLVED, resolved))
            self.advance()
        else:
            self.events.append((step_id, EventKind.STEP_RESOLVED, resolved))
            self.fail_step(step_id, f"resolved as failed by {actor.get('name', 'an operator')}")
            self.derive_status()

    def derive_status(self) -> None:
        """Set the execution status from its steps (SPEC §6)."""
        statuses = {state.status for state in self.steps.values()}
        if self.cancel_requested:
            ended = E.FAILED if self.stop_reason == "deadline" else E.CANCELLED
            status = E.RUNNING if S.RUNNING in statuses else ended
        elif statuses & {S.READY, S.RUNNING}:
            status = E.RUNNING if self.status != E.QUEUED or S.RUNNING in statuses else E.QUEUED
        elif S.WAITING in statuses:
            status = E.WAITING
        elif S.UNKNOWN in statuses:
            status = E.NEEDS_ATTENTION
        elif S.FAILED in statuses:
            status = E.FAILED
        elif statuses <= DONE_STEP:
            status = E.SUCCEEDED
        else:
            status = E.FAILED
        if self.paused and not self.cancel_requested and status != E.SUCCEEDED:
            # Held until resumed; only an execution with nothing left to do leaves a pause.
            return
        self._forget_pause()
        if status != self.status:
            detail = transition(self.status, status)
            if self.stop_reason is not None and status in TERMINAL_EXECUTION:
                detail["reason"] = self.stop_reason
            self.events.append((None, execution_event(status), detail))
            self.status = status
            self.changes.execution_changed = True

    # ---- pause and resume (SPEC §14) -----------------------------------------------

    def hold(self) -> bool:
        """Whether nothing may start or continue now: the execution is paused, or its
        workflow is — which pauses it here, the first time a worker touches it."""
        if self.terminal or self.cancel_requested:
            return False
        if self.workflow_paused_by is not None and not self.paused:
            self.pause(PauseReason.WORKFLOW, actor=self.workflow_paused_by or WORKFLOW_PAUSE_ACTOR)
        return self.paused

    def pause(
        self, reason: str, *, actor: dict[str, Any], detail: dict[str, Any] | None = None
    ) -> None:
        """Hold the execution: ready steps are not claimed, nothing new is promoted, a
        request in flight finishes and is recorded. A paused one stays as it is."""
        if self.paused or self.terminal or self.cancel_requested:
            return
        self.paused_from = self.status if self.status in PAUSABLE_EXECUTION else E.RUNNING
        self.pause_reason = reason
        entry = {**transition(self.status, E.PAUSED), "reason": reason, "actor": dict(actor)}
        self.events.append((None, execution_event(E.PAUSED), {**entry, **(detail or {})}))
        self.status = E.PAUSED
        self.changes.execution_changed = True

    def pause_exhausted(self, step_id: str, error: str) -> None:
        """retry.on_exhausted "pause": the step's tries ran out; it is `failed` but nothing
        else is stopped, and the execution waits, paused, for an operator."""
        self.set_step(step_id, S.FAILED, error=error, lease_owner=None)
        self.pause(PauseReason.EXHAUSTED, actor=FLOW_CONTROL_ACTOR, detail={"step": step_id})
        self.derive_status()

    def _forget_pause(self) -> None:
        self.paused_from = None
        self.pause_reason = None

    def unpause(self, *, actor: dict[str, Any]) -> list[str]:
        """Resume a paused execution: steps whose tries ran out run again (a fresh set of
        tries), ready steps are dispatched again, and it goes on as it was. One that was
        queued for a slot goes back to its place in the queue (the caller fills slots).
        Returns the steps run again."""
        was = self.paused_from or E.RUNNING
        rerun = [s.id for s in self.definition.steps if self.steps[s.id].status == S.FAILED]
        for step_id in rerun:
            self.set_step(
                step_id,
                S.READY,
                attempts=0,
                error=None,
                wake_at=None,
                started_at=None,  # budget_s counts from the first attempt of this run
                finished_at=None,
            )
        self.events.append(
            (None, EventKind.EXECUTION_RESUMED, {"actor": dict(actor), "steps": rerun})
        )
        self._forget_pause()
        self.changes.execution_changed = True
        if was == E.QUEUED:
            self.events.append((None, execution_event(E.QUEUED), transition(E.PAUSED, E.QUEUED)))
            self.status = E.QUEUED
            if self.concurrency_key is not None and not self.held_slot:
                return rerun
        for step in self.definition.steps:
            ready = self.steps[step.id].status == S.READY
            if ready and step.type not in PURE_TYPES and step.id not in self.dispatch:
                self.dispatch.append(step.id)
        self.advance()
        return rerun

    def fail_paused(self, *, actor: dict[str, Any]) -> None:
        """An operator gives up on an execution paused at a step whose tries ran out: it
        fails as it would have under on_exhausted "fail"."""
        failed = [s.id for s in self.definition.steps if self.steps[s.id].status == S.FAILED]
        name = actor.get("name", "an operator")
        self.events.append((None, EventKind.FAIL_REQUESTED, {"actor": dict(actor)}))
        for step_id in failed:
            error = self.steps[step_id].error or "failed"
            self.fail_step(step_id, f"{error}; failed by {name} while paused")

    def started(self) -> None:
        """Leave `queued` when a worker first touches the execution."""
        if self.status == E.QUEUED:
            self.events.append((None, execution_event(E.RUNNING), transition(E.QUEUED, E.RUNNING)))
            self.status = E.RUNNING
            self.changes.execution_changed = True


def backoff_seconds(policy: RetryPolicy, attempts_used: int) -> float:
    """Exponential back-off with equal jitter: never zero, never in lock-step."""
    base = policy.initial_interval_s * policy.backoff_coefficient ** max(attempts_used - 1, 0)
    capped = min(base, policy.max_interval_s)
    return capped / 2 + random.uniform(0, capped / 2)
