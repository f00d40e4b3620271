"""The operator actions on one execution, each declared once (docs/contract.md#http-api,
docs/reference/http-api.md): its name, what it takes, the unit of work it runs in
flowforge/usecases/actions.py, how it answers, and when the console offers it. The API route,
the console's form and route, the CLI command (remote and on the box) and the OpenAPI path
are all made from these declarations, so adding an action is its declaration here, its unit
of work in the store and its transition in the engine.

Who may is the same for every one of them: a key that may write the execution's workflow
(the API and the console check it before the unit of work runs; on the box, anyone with the
database). Imports only the domain's words: the CLI parser reads these declarations for
`--help` without loading the definitions parser."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from flowforge.domain.model import (
    RETRIED_STEP,
    TERMINAL_EXECUTION,
    ExecutionStatus,
    StepStatus,
)

# An operator retry restarts these; a running or succeeded execution is left alone.
RETRIED_EXECUTION = frozenset(
    {ExecutionStatus.FAILED, ExecutionStatus.CANCELLED, ExecutionStatus.NEEDS_ATTENTION}
)


class Kind(StrEnum):
    """What an action takes besides the execution; each surface parses a kind one way."""

    STEP = "step"  # in the path: a step id of the definition
    STEP_ROW = "step_row"  # in the path: a step id, or a map item's step (`lines[3].reserve`)
    OUTCOME = "outcome"  # in the body: succeeded or failed, required
    OUTPUT = "output"  # in the body: any JSON, null when left out


IN_PATH = frozenset({Kind.STEP, Kind.STEP_ROW})


@dataclass(frozen=True)
class Param:
    kind: Kind
    help: str

    @property
    def field(self) -> str:
        """Its name in a request body or a form (a path's step is `step`)."""
        return "step" if self.kind in IN_PATH else self.kind.value


class Answer(StrEnum):
    """What an action answers: {"execution_id", "status"} with the declared code, or (a
    cancel) 200 when the execution had already finished and 202 while it stops."""

    STATUS = "status"
    CANCEL = "cancel"


@dataclass(frozen=True)
class Done:
    """What a unit of work reports: the execution's status after it."""

    execution_id: str
    status: str
    already_finished: bool = False

    def body(self) -> dict[str, Any]:
        """The API's answer (the OpenAPI document's ActionResult)."""
        return {"execution_id": self.execution_id, "status": self.status}


@dataclass(frozen=True)
class Shown:
    """What the rules read of an execution: the engine's `Run` and the API's view of it both
    give this, so the console offers an action exactly when the store would take it."""

    status: str
    steps: tuple[tuple[str, str], ...]  # (step id, status)
    cancel_requested: bool = False
    paused: bool | None = None  # None: read from the status

    @property
    def is_paused(self) -> bool:
        return self.status == ExecutionStatus.PAUSED if self.paused is None else self.paused


def retry_refusal(status: str, steps: Iterable[tuple[str, str]]) -> str | None:
    """Why an execution in `status` with these (step id, status) cannot be retried, or None
    when it can: the rule retry applies, which the console asks before offering it. With
    an unknown step, only if something else can re-run."""
    if status not in RETRIED_EXECUTION:
        return (
            f"execution is {status}; only failed, cancelled or needs_attention "
            "executions can be retried"
        )
    steps = list(steps)
    unknown = [step_id for step_id, step_status in steps if step_status == StepStatus.UNKNOWN]
    if unknown and not any(step_status in RETRIED_STEP for _, step_status in steps):
        return (
            f"nothing to retry: the outcome of step {unknown[0]!r} is unknown; resolve it "
            "(as failed, then retry, to send it again)"
        )
    return None


def pause_refusal(status: str, *, cancel_requested: bool) -> str | None:
    """Why an execution in `status` cannot be paused, or None when it can (pausing a
    paused one is a no-op): the rule pause applies, which the console asks before
    offering it."""
    if status in TERMINAL_EXECUTION or cancel_requested:
        return f"execution is {status}; only a live execution can be paused"
    return None


def fail_paused_refusal(
    status: str, step_statuses: Iterable[str], *, paused: bool | None = None
) -> str | None:
    """Why an execution cannot be failed as paused at a step whose tries ran out, or None
    when it can; `paused` defaults to the status (the engine reads it from the pause
    reason). The rule fail_paused applies, which the console asks before offering it."""
    paused = status == ExecutionStatus.PAUSED if paused is None else paused
    if not paused or StepStatus.FAILED not in set(step_statuses):
        return (
            f"execution is {status}; only one paused at a step whose tries ran out "
            "can be failed (cancel it otherwise)"
        )
    return None


def _retry_label(shown: Shown) -> str:
    """What the retry button does to this execution, in words: "Retry failed steps" on a
    cancelled execution where nothing failed would promise what it does not do."""
    statuses = {status for _, status in shown.steps}
    failed, cancelled = StepStatus.FAILED in statuses, StepStatus.CANCELLED in statuses
    if failed and cancelled:
        return "Retry failed and cancelled steps"
    if failed:
        return "Retry failed steps"
    if cancelled:
        return "Re-run cancelled steps"
    return "Run the remaining steps"


@dataclass(frozen=True)
class Button:
    """The console's button for an action on the execution page, shown when `offered`."""

    id: str
    label: str | Callable[[Shown], str]
    offered: Callable[[Shown], bool]
    danger: bool = False

    def text(self, shown: Shown) -> str:
        return self.label if isinstance(self.label, str) else self.label(shown)


@dataclass(frozen=True)
class Action:
    """One operator action on an execution."""

    name: str  # the route's endpoint, and (dashed) the CLI command
    summary: str  # the OpenAPI summary and the routes' docstring
    help: str  # the CLI command's --help
    answers: dict[str, str]  # the success status(es) -> what it means
    route: str = ""  # the last path segment (default: the name), after /executions/<id>/
    does: str = ""  # its unit of work, a function of usecases/actions.py (default: the name)
    example_args: str = ""  # what follows the execution id in the CLI command's example
    said: str = "execution {id} is now {status}"  # the CLI's answer, with the arguments
    refusals: tuple[int, ...] = (404, 409)  # what the unit of work may answer instead
    params: tuple[Param, ...] = ()
    answer: Answer = Answer.STATUS
    body: str | None = None  # the OpenAPI schema of its body, when it takes one
    button: Button | None = None  # its button on the execution page (steps: the template)

    def __post_init__(self) -> None:
        object.__setattr__(self, "route", self.route or self.name)
        object.__setattr__(self, "does", self.does or self.name)

    @property
    def command(self) -> str:
        return self.name.replace("_", "-")

    @property
    def example(self) -> str:
        """The CLI command's example, shown at the end of its --help."""
        return " ".join(filter(None, ("flowforge", self.command, EXAMPLE_ID, self.example_args)))

    @property
    def step(self) -> Param | None:
        """The step it acts on, if it acts on one."""
        return next((p for p in self.params if p.kind in IN_PATH), None)

    @property
    def fields(self) -> tuple[Param, ...]:
        """What its body (or form) carries."""
        return tuple(p for p in self.params if p.kind not in IN_PATH)

    def path(self, execution: str, step: str) -> str:
        """Its path after the executions' prefix, with `execution` and `step` as written."""
        on = f"{execution}/steps/{step}" if self.step else execution
        return f"{on}/{self.route}"

    def code(self, done: Done) -> int:
        """The HTTP status of its answer."""
        if self.answer is Answer.CANCEL:
            return 200 if done.already_finished else 202
        return int(next(iter(self.answers)))


STEP_ARG = "the step's id in the definition"
EXAMPLE_ID = "01a233ee-a3de-71f1-8ccd-4191093a47ad"

ACTIONS = (
    Action(
        name="cancel",
        summary="Cancel: 202 while work is stopping, 200 once terminal",
        help="cancel an execution: queued and waiting work stops at once, a request in "
        "flight finishes and is recorded",
        said="",  # Answer.CANCEL says which of three things happened
        answers={"200": "Already finished", "202": "Cancelling"},
        refusals=(404,),
        answer=Answer.CANCEL,
        button=Button(
            "cancel",
            "Cancel execution",
            lambda shown: shown.status not in TERMINAL_EXECUTION,
            danger=True,
        ),
    ),
    Action(
        name="retry",
        summary="Re-run failed and cancelled steps, reusing every checkpoint; unknown stays "
        "unknown",
        help="re-run failed and cancelled steps",
        answers={"202": "Queued again"},
        button=Button(
            "retry",
            _retry_label,
            lambda shown: retry_refusal(shown.status, shown.steps) is None,
        ),
    ),
    Action(
        name="pause",
        summary="Pause: nothing of it starts or continues; a request in flight finishes",
        help="pause an execution: nothing of it starts until resumed",
        answers={"200": "Paused"},
        button=Button(
            "pause",
            "Pause",
            lambda shown: (
                shown.status != ExecutionStatus.PAUSED
                and pause_refusal(shown.status, cancel_requested=shown.cancel_requested) is None
            ),
        ),
    ),
    Action(
        name="resume",
        summary="Resume a paused execution; a step whose tries ran out runs again",
        help="resume a paused execution (an exhausted step runs again)",
        answers={"200": "Resumed"},
        button=Button("resume", "Resume", lambda shown: shown.status == ExecutionStatus.PAUSED),
    ),
    Action(
        name="fail_paused",
        route="fail",
        summary="Fail an execution paused at a step whose tries ran out (retry.on_exhausted pause)",
        help="fail an execution paused at an exhausted step",
        answers={"200": "Failed"},
        button=Button(
            "fail-paused",
            "Fail it",
            lambda shown: fail_paused_refusal(shown.status, (s for _, s in shown.steps)) is None,
            danger=True,
        ),
    ),
    Action(
        name="resolve",
        summary="Settle a step whose remote effect is unknown (a map item's step too)",
        help="settle a step whose outcome is unknown",
        example_args="charge succeeded '{\"status\": 201}'",
        said="step {step} resolved as {outcome}; execution is now {status}",
        answers={"200": "Resolved"},
        params=(
            Param(Kind.STEP_ROW, STEP_ARG),
            Param(Kind.OUTCOME, "what the request did"),
            Param(Kind.OUTPUT, "the step's output, with succeeded"),
        ),
        body="Resolution",
    ),
    Action(
        name="complete",
        does="complete_wait",
        summary="End a waiting wait step as a resume would, recorded with the API key",
        help="end a waiting wait step as a resume would",
        example_args="approval '{\"approved\": true}'",
        said="step {step} completed; execution is now {status}",
        answers={"200": "Completed"},
        params=(
            Param(Kind.STEP, STEP_ARG),
            Param(Kind.OUTPUT, "the wait step's output (default null)"),
        ),
        body="Completion",
    ),
    Action(
        name="fail",
        does="fail_wait",
        summary="Fail a waiting wait step (and so its execution), recorded with the API key",
        help="fail a waiting wait step (the execution fails)",
        example_args="approval",
        said="step {step} failed; execution is now {status}",
        answers={"200": "Failed"},
        params=(Param(Kind.STEP, STEP_ARG),),
    ),
)
BY_NAME = {action.name: action for action in ACTIONS}
