"""What one unit of work changed, as values: the step rows as loaded and changed, the
attempt rows to insert and close, and everything else `store/runs.save_run` writes
(`Changes`). The engine (flowforge/domain/engine.py) and its step kinds
(flowforge/domain/kinds/) write them; the store saves them and observe/ counts them, and
neither has to reach back into a `Run`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from flowforge.domain.model import TERMINAL_EXECUTION, EventKind, StepType, step_event
from flowforge.domain.model import StepStatus as S

if TYPE_CHECKING:
    from flowforge.domain.kinds.workflow import ChildStart


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
    # The concurrency slot this unit of work freed (docs/contract.md#slots): runs.save_run hands it
    # to the next queued execution of the key in the same transaction.
    released_slot: tuple[int, str] | None = None
    # Wait steps that took their early resume: saving marks those resumes applied.
    applied_resumes: list[str] = field(default_factory=list)
    # docs/contract.md#events: event waits that opened (step id, name, key, sender) and the
    # events steps took (event id, step id); saved by store/events.py only when non-empty.
    event_waits: list[tuple[str, str, str, str | None]] = field(default_factory=list)
    consumed_events: list[tuple[str, str]] = field(default_factory=list)
    # Step rows created in this unit of work (a map's items as they start): inserted,
    # not updated. Each is in `steps` too, with its state as it is now.
    new_steps: list[str] = field(default_factory=list)
    # docs/contract.md#pause: what a paused execution was, and why it is paused (None: not paused).
    paused_from: str | None = None
    pause_reason: str | None = None
    # docs/contract.md#child-workflows: child executions to create (a workflow step started), child
    # executions to cancel (their workflow step was cancelled), and the parent's workflow step to
    # wake (execution id, step id) because this child ended or needs, or no longer needs, an
    # operator.
    child_starts: list[ChildStart] = field(default_factory=list)
    child_cancels: list[str] = field(default_factory=list)
    wake_parent: tuple[str, str] | None = None
    # For the spans written after the commit (flowforge/observe/tracing.py).
    workflow: str = ""
    # docs/contract.md#failure-groups: set by runs.save_run, before the listeners hear of the
    # commit, when this unit of work opened a failure group (new, or resolved and recurring).
    failure_group_opened: bool = False
    traceparent: str | None = None


# ---- what a unit of work did, in the engine's words (observe/ counts it) -----------------

# The wait ends the engine records, by the event it writes for each.
WAIT_ENDS = frozenset(
    {
        EventKind.WAIT_RESUMED,
        EventKind.WAIT_TIMED_OUT,
        EventKind.WAIT_COMPLETED,
        EventKind.WAIT_FAILED,
    }
)
# The statuses a step's run ends in; its time runs from its first start to this end.
STEP_ENDS = frozenset({S.SUCCEEDED, S.FAILED, S.UNKNOWN})
_WAITING = step_event(S.WAITING)


@dataclass(frozen=True)
class Happened:
    """What one saved unit of work did: attempts ended (step type, outcome), wait steps
    that began waiting, wait ends (their EventKind), steps ended (type, seconds from
    their first start) and the execution's end (its terminal status, or None)."""

    attempts_ended: tuple[tuple[str, str], ...] = ()
    waits_started: int = 0
    waits_ended: tuple[str, ...] = ()
    steps_ended: tuple[tuple[str, float], ...] = ()
    execution_ended: str | None = None


NOTHING_HAPPENED = Happened()


def happened(changes: Changes) -> Happened:
    """Say what `changes` did. An attempt of a step this unit of work did not change
    counts as an http_request's (only a request's attempt closes without its step)."""
    if not (changes.events or changes.finished_attempts or changes.new_attempts):
        return NOTHING_HAPPENED
    steps = changes.steps
    ended = [(a.step_id, a.outcome) for a in changes.new_attempts if a.outcome is not None]
    ended += [(a.step_id, a.outcome) for a in changes.finished_attempts]
    attempts = []
    for step_id, outcome in ended:
        state = steps.get(step_id)
        attempts.append((state.type if state is not None else StepType.HTTP_REQUEST, outcome))
    waits_started, waits_ended = 0, []
    for event_step, event, _detail in changes.events:
        if event == _WAITING:
            state = steps.get(event_step or "")
            if state is not None and state.type == StepType.WAIT:
                waits_started += 1
        elif event in WAIT_ENDS:
            waits_ended.append(event)
    steps_ended = tuple(
        (state.type, max(0.0, (state.finished_at - state.started_at).total_seconds()))
        for state in steps.values()
        if state.status in STEP_ENDS
        and state.started_at is not None
        and state.finished_at is not None
    )
    execution_ended = (
        changes.status
        if changes.execution_changed and changes.status in TERMINAL_EXECUTION
        else None
    )
    return Happened(
        tuple(attempts), waits_started, tuple(waits_ended), steps_ended, execution_ended
    )
