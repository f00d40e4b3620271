"""The workflow step (docs/contract.md#child-workflows): it starts an execution of another
workflow (its child) in the unit of work that starts it, and waits, holding no thread,
until the child's end wakes it (store/children.py writes that wake-up).

The child is created by the save (`Changes.child_starts`, keyed by the step's round, its
fencing token, so one round never makes two); a cancelled step cancels its child.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flowforge.domain import inputschema
from flowforge.domain.kinds.base import Loader, StepKind
from flowforge.domain.model import TERMINAL_EXECUTION, AttemptOutcome, EventKind, StepType
from flowforge.domain.model import ExecutionStatus as E
from flowforge.domain.model import StepStatus as S
from flowforge.domain.templating import TemplateError, render

if TYPE_CHECKING:
    from flowforge.domain.changes import StepState
    from flowforge.domain.definitions import Definition, Step
    from flowforge.domain.engine import Run

# A workflow step in these statuses starts no child in this unit of work (any other may:
# a retry makes a failed one pending, and it starts at once).
_CHILD_STARTED = frozenset({S.WAITING, S.SUCCEEDED, S.SKIPPED})


@dataclass(frozen=True)
class ChildTarget:
    """The newest version of a workflow that a workflow step may start
    (docs/contract.md#child-workflows), as the unit of work found it: the child is pinned to it."""

    workflow_id: int
    version_id: int
    version: int
    definition: Definition


@dataclass
class ChildState:
    """A workflow step's child execution as the unit of work found it: its status, and
    its output (succeeded) or what went wrong (failed, cancelled)."""

    execution_id: str
    status: E
    output: Any = None
    error: str | None = None


@dataclass(frozen=True)
class ChildStart:
    """A child execution to create in the unit of work that started its workflow step:
    `key` is its system idempotency key, one per round of the step (its fencing token),
    so the same round can never create a second child."""

    step_id: str
    execution_id: str
    key: str
    workflow: str
    target: ChildTarget
    input: Any
    depth: int
    priority: int
    # The root of its tree (its parent's root, or the parent itself when that is a root).
    root_id: str
    # Its concurrency key when its workflow has a limit (docs/contract.md#concurrency), else None:
    # the save admits it through flow control like any execution of that workflow.
    concurrency_key: str | None = None


def child_key(execution_id: str, step_id: str, fencing_token: int) -> str:
    """The system idempotency key of a workflow step's child in one round of the step."""
    return f"child:{execution_id}:{step_id}:{fencing_token}"


class WorkflowKind(StepKind):
    type = StepType.WORKFLOW

    def advance(self, run: Run, step: Step) -> bool:
        """A ready step starts its child; a waiting one takes its child's news."""
        if run.steps[step.id].status == S.WAITING:
            return _check_child(run, step)
        return super().advance(run, step)

    def start(self, run: Run, step: Step) -> None:
        """Start a workflow step: its child execution is created in this unit of work
        (Changes.child_starts, keyed by the step's round) and the step waits for it."""
        assert step.workflow is not None
        try:
            child_input = render(step.child_input, run.context(step.id))
        except TemplateError as exc:
            _refused(run, step.id, f"input: {exc}")
            return
        target = run.child_targets.get(step.workflow)
        refusal = _refusal(run, step, target, child_input)
        if refusal is not None:
            _refused(run, step.id, refusal)
            return
        assert target is not None
        # The child's own definition says its priority and concurrency key, as for any
        # execution of it: a flow-controlled child (docs/contract.md#flow-control) is
        # admitted by its key when it is saved.
        admission = run.admission(target.definition, child_input)
        if isinstance(admission, str):
            _refused(run, step.id, admission)
            return
        priority, ckey = admission
        state = run.steps[step.id]
        child_id = run.new_id()
        run.changes.child_starts.append(
            ChildStart(
                step.id,
                child_id,
                child_key(run.execution_id, step.id, state.fencing_token),
                step.workflow,
                target,
                child_input,
                run.depth + 1,
                priority,
                run.root_id or run.execution_id,
                ckey,
            )
        )
        link = {"execution_id": child_id, "workflow": step.workflow, "version": target.version}
        run.events.append((step.id, EventKind.CHILD_STARTED, dict(link)))
        run.children[step.id] = ChildState(child_id, E.QUEUED)
        run.set_step(
            step.id,
            S.WAITING,
            output=link,
            started_at=state.started_at or run.now,
            reason=f"waiting for execution {child_id} of {step.workflow}",
        )

    def changed(self, run: Run, state: StepState, previous: str) -> None:
        """A waiting workflow step was cancelled: so is its child, by the cancel rules."""
        if previous == S.WAITING and state.status == S.CANCELLED:
            child = child_of(run, state.step_id)
            if child is not None and child.status not in TERMINAL_EXECUTION:
                run.changes.child_cancels.append(child.execution_id)

    def load(self, run: Run, loader: Loader) -> None:
        """Each step's child, and, when a step may start one now, the versions it would
        pin and the size of its tree (docs/contract.md#child-workflows: only workflows with
        workflow steps pay for these reads)."""
        run.children = loader.children()
        run.max_child_depth, max_descendants = loader.child_limits()
        run.new_id = loader.new_execution_id
        if any(
            run.steps[step.id].status not in _CHILD_STARTED
            for step in run.definition.steps
            if step.workflow is not None
        ):
            # A step about to start a child counts its tree, which stays locked until
            # this unit of work ends (FLOWFORGE_MAX_DESCENDANTS).
            run.max_descendants = max_descendants
            run.descendants = loader.descendants(run.root_id or run.execution_id)
            run.child_targets = loader.child_targets(run.definition.child_workflows())


def _refusal(run: Run, step: Step, target: ChildTarget | None, child_input: Any) -> str | None:
    """Why the step's child may not be started, or None."""
    depth = run.depth + 1
    if depth > run.max_child_depth:
        return (
            f"not started: a child of this execution would be at depth {depth}, beyond"
            f" FLOWFORGE_MAX_CHILD_DEPTH {run.max_child_depth} (do workflows call each"
            " other in a cycle?)"
        )
    if target is None:
        return f"not started: workflow {step.workflow!r} does not exist or is archived"
    if run.descendants + len(run.changes.child_starts) >= run.max_descendants:
        return (
            f"not started: root execution {run.root_id or run.execution_id} already has "
            f"{run.max_descendants} executions below it, FLOWFORGE_MAX_DESCENDANTS "
            f"{run.max_descendants}"
        )
    if target.definition.input_schema is not None:
        try:
            checker = inputschema.validator(target.definition.input_schema)
            inputschema.check(checker, child_input)
        except inputschema.InputInvalid as exc:
            paths = ", ".join(e["path"] for e in (exc.errors or [])[:5])
            return f"input: {exc} ({paths})"
        except inputschema.InputTooLarge as exc:
            return f"input: {exc}"
    return None


def _refused(run: Run, step_id: str, error: str) -> None:
    run.record_pure_attempt(step_id, AttemptOutcome.FAILED, error)
    run.fail_step(step_id, error)


def child_of(run: Run, step_id: str) -> ChildState | None:
    """The child a waiting workflow step waits for (None: none, or not this round's)."""
    state = run.steps[step_id]
    child = run.children.get(step_id)
    expected = state.output.get("execution_id") if isinstance(state.output, dict) else None
    if child is None or child.execution_id != expected:
        return None
    return child


def _check_child(run: Run, step: Step) -> bool:
    """A waiting workflow step takes its child's end: its output when it succeeded, a
    failure when it failed or was cancelled. A child that needs an operator keeps the
    step waiting, saying so (its error), until the child goes on. Returns whether
    anything changed."""
    state = run.steps[step.id]
    child = child_of(run, step.id)
    if child is None:
        return False
    ended = {"execution_id": child.execution_id, "status": str(child.status)}
    if child.status == E.SUCCEEDED:
        run.record_pure_attempt(step.id, AttemptOutcome.SUCCEEDED)
        run.events.append((step.id, EventKind.CHILD_ENDED, ended))
        run.set_step(step.id, S.SUCCEEDED, output=child.output, error=None)
        return True
    if child.status in (E.FAILED, E.CANCELLED):
        error = f"child execution {child.execution_id} of {step.workflow} {child.status}"
        if child.error:
            error += f": {child.error}"
        run.record_pure_attempt(step.id, AttemptOutcome.FAILED, error)
        run.events.append((step.id, EventKind.CHILD_ENDED, ended))
        run.fail_step(step.id, error)
        return True
    attention = child.status == E.NEEDS_ATTENTION
    if attention and state.error is None:
        run.events.append(
            (step.id, EventKind.CHILD_NEEDS_ATTENTION, {"execution_id": child.execution_id})
        )
        run.set_step(
            step.id,
            S.WAITING,
            error=(
                f"waiting on child execution {child.execution_id} of {step.workflow},"
                " which needs attention: resolve it there and this step goes on"
            ),
            reason="the child needs attention",
        )
        return True
    if not attention and state.error is not None:
        run.set_step(step.id, S.WAITING, error=None, reason="the child goes on")
        return True
    return False


KIND = WorkflowKind()
