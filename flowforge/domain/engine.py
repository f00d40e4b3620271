"""DAG progression of one execution, as pure Python over its loaded rows: the state
machine core, with a module per step kind (flowforge/domain/kinds/) and the operators'
transitions (flowforge/domain/interventions.py) beside it.

Every change to an execution happens in a unit of work: load the execution and its steps
under the execution row lock, change a `Run` in memory, save what changed in the same
transaction. Keeping the rules here, free of SQL and I/O, lets the worker, the reaper,
the timer scanner and operator actions share one set of transitions, and lets unit tests
drive them without a database.

The core owns what every step has: its status and history, its dependencies and `when`,
its attempts, lease, retries and budget_s, and the execution's status derived from its
steps. What a step does is its kind's (kinds/base.py says how the core asks it): KINDS
names one per StepType. A `running` step's outcome follows docs/contract.md#outcomes-stick:
no transition silently repeats an unsafe request.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar

from flowforge.domain import event_waits, interventions
from flowforge.domain.changes import Changes, FinishedAttempt, NewAttempt, StepState
from flowforge.domain.definitions.bounds import MAX_MAP_ITEMS
from flowforge.domain.definitions.delays import parse_until
from flowforge.domain.definitions.flowcontrol import (
    KeyUnrendered,
    PriorityInvalid,
    execution_priority,
    render_concurrency_key,
)
from flowforge.domain.definitions.shapes import (
    Definition,
    RetryPolicy,
    Step,
    item_row,
    split_item_row,
)
from flowforge.domain.event_waits import EventPort
from flowforge.domain.kinds import (
    delay,
    http_request,
    map,
    transform,
    wait,
    workflow,
)
from flowforge.domain.kinds.base import StepKind
from flowforge.domain.kinds.workflow import ChildState, ChildTarget
from flowforge.domain.model import (
    CANCELLABLE_STEP,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_CHILD_DEPTH,
    DEFAULT_MAX_DESCENDANTS,
    DONE_STEP,
    FINAL_STEP,
    FLOW_CONTROL_ACTOR,
    TERMINAL_EXECUTION,
    AttemptOutcome,
    EventKind,
    OnExhausted,
    Outcome,
    OutcomeKind,
    PauseReason,
    StepType,
    StopReason,
    execution_event,
    step_event,
    transition,
)
from flowforge.domain.model import ExecutionStatus as E
from flowforge.domain.model import StepStatus as S
from flowforge.domain.templating import TemplateError, evaluate_condition

# A step that ends in one of these gets its finished_at.
_ENDED_STEP = FINAL_STEP | {S.UNKNOWN}


def _describe(condition: dict[str, Any]) -> str:
    """A `when` as one reads it: `shape.total gt 100`."""
    if condition["op"] == "exists":
        return f"{condition['path']} exists"
    return f"{condition['path']} {condition['op']} {json.dumps(condition['value'])}"


@dataclass
class Run:
    """An execution under its row lock: the state every transition reads and changes.

    What changed is logged in `changes` until take_changes() hands it over for saving.
    """

    execution_id: str
    workflow: str
    version: int
    status: E
    input: Any
    definition: Definition
    steps: dict[str, StepState]
    now: datetime
    cancel_requested: bool = False
    # Flow control (docs/contract.md#flow-control): why a stop was asked, the execution's
    # concurrency key and whether it held a slot when loaded (a slot frees when it is terminal,
    # docs/contract.md#slots), and whether its deadline or queue expiry had passed by the
    # transaction's now().
    stop_reason: StopReason | None = None
    workflow_id: int = 0
    concurrency_key: str | None = None
    held_slot: bool = False
    deadline_passed: bool = False
    expired: bool = False
    # Resumes recorded before their wait step was ready (step id -> body); loaded only for
    # workflows with wait steps, taken (Changes.applied_resumes) when the step starts.
    early_resumes: dict[str, Any] = field(default_factory=dict)
    # docs/contract.md#events: the store's events, set only for workflows with an event wait.
    event_port: EventPort | None = None
    # Pause (docs/contract.md#pause): what the execution was when paused and why (both None unless
    # it is `paused`), and whether its workflow is paused, by whom (the actor of the pause).
    paused_from: E | None = None
    pause_reason: PauseReason | None = None
    workflow_paused_by: dict[str, Any] | None = None
    # The webhook's trace context, stored at intake (flowforge/observe/tracing.py); None if none.
    traceparent: str | None = None
    # Child workflows (docs/contract.md#child-workflows): how deep this execution is (0: not a
    # child), its parent (execution id, step id), the bound on depth, the newest version of each
    # workflow its workflow steps may start now (None: none to start), each workflow step's newest
    # child, and how a new execution id is made (the store's UUIDv7).
    depth: int = 0
    parent: tuple[str, str] | None = None
    max_child_depth: int = DEFAULT_MAX_CHILD_DEPTH
    # The root of this execution's tree (None: it is a root), how many executions that root
    # has below it (loaded only when a workflow step may start one) and the bound on them.
    root_id: str | None = None
    descendants: int = 0
    max_descendants: int = DEFAULT_MAX_DESCENDANTS
    child_targets: dict[str, ChildTarget | None] = field(default_factory=dict)
    children: dict[str, ChildState] = field(default_factory=dict)
    new_id: Callable[[], str] = field(default=lambda: str(uuid.uuid4()), repr=False)
    # Maps whose settled items were not loaded (a worker's unit of work loads the open
    # items only, flowforge/store/runs.py): map id -> the statuses among those rows that
    # are neither succeeded nor skipped (they still count for the execution's status).
    # `load_items` reads every row of a map's items, for when the map needs them all: it
    # ends, starts again, or an operator acts. Empty and None: every row is loaded.
    unloaded: dict[str, frozenset[str]] = field(default_factory=dict)
    load_items: Callable[[str], list[StepState]] | None = None
    changes: Changes = field(init=False)
    # What step kinds keep for the unit of work, by kind (a map's rendered items and
    # progress, kinds/map.py), and the round of advance() under way: a kind rebuilds
    # what it derives from the rows once per round.
    kind_state: dict[str, Any] = field(init=False, repr=False)
    advance_round: int = field(init=False, repr=False)
    _advancing: bool = field(init=False, repr=False)
    # The cap on a map's items (docs/contract.md#map), for kinds/map.py.
    max_map_items: ClassVar[int] = MAX_MAP_ITEMS

    def __post_init__(self) -> None:
        self.changes = Changes(self.execution_id)
        self.kind_state, self.advance_round, self._advancing = {}, 0, False

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
        """Template context of a step: input, execution, and its finished ancestors; for
        an item's step also `item`, `index` and the finished steps of the item before it."""
        parts = split_item_row(step_id)
        if parts is not None:
            return map.item_context(self, *parts)
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

    def row_ids(self) -> list[str]:
        """Every step row: the workflow's steps in definition order, then items' rows."""
        top = [step.id for step in self.definition.steps]
        known = set(top)
        return top + [row_id for row_id in self.steps if row_id not in known]

    def stopping(self, step_id: str) -> bool:
        """Whether a step that ends now must not be tried again: its execution was asked
        to stop, or it is an item's step of a map that ended (failed fast, or cancelled)."""
        if self.cancel_requested:
            return True
        parts = split_item_row(step_id)
        return parts is not None and self.steps[parts[0]].status != S.WAITING

    @property
    def terminal(self) -> bool:
        """Whether the execution has finished for good."""
        return self.status in TERMINAL_EXECUTION

    @property
    def paused(self) -> bool:
        """Whether the execution is paused (docs/contract.md#pause): nothing of it starts or
        continues. Read from the reason, which resume clears before the status is derived again."""
        return self.pause_reason is not None

    @property
    def releases_slot(self) -> bool:
        """Whether the concurrency slot the execution held is free now."""
        return self.held_slot and self.terminal

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

    def kind_of(self, step_type: str) -> StepKind:
        """The kind that does what a step of this type does."""
        return KINDS[step_type]

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
        if status in _ENDED_STEP and state.finished_at is None:
            state.finished_at = self.now
        self.changes.steps[step_id] = state
        KINDS[state.type].changed(self, state, previous)
        detail = transition(previous, status)
        if state.error and status in {S.FAILED, S.UNKNOWN, S.WAITING, S.CANCELLED}:
            detail["error"] = state.error
        if reason is not None:
            detail["reason"] = reason
        self.events.append((step_id, step_event(status), detail))

    def advance(self) -> None:
        """Promote steps whose parents are done and let each step's kind move it on
        (a pure step runs) until nothing moves.

        Pure steps run here, inside the checkpoint transaction that made them ready, so a
        chain of transforms costs one commit instead of a broker round trip per step.
        """
        if self.cancel_requested or self.terminal:
            self.derive_status()
            return
        if self.hold():
            self.derive_status()
            return
        outermost, self._advancing = not self._advancing, True
        if outermost:
            self.advance_round += 1
        try:
            moved = True
            while moved:
                moved = False
                for step in self.definition.steps:
                    if self.steps[step.id].status == S.PENDING and self.promote(step):
                        moved = True
                    if self.steps[step.id].status != S.PENDING:
                        moved = KINDS[step.type].advance(self, step) or moved
        finally:
            self._advancing = not outermost
        self.derive_status()

    def promote(self, step: Step) -> bool:
        """Make a pending step ready when every step it depends on is done (skipped when
        all of them were skipped); one that leaves the process is dispatched."""
        parents = [self.steps[p] for p in step.depends_on]
        if not all(p.status in DONE_STEP for p in parents):
            return False
        if parents and all(p.status == S.SKIPPED for p in parents):
            self.set_step(step.id, S.SKIPPED, reason="every step it depends on was skipped")
            return True
        self.set_step(step.id, S.READY)
        if not KINDS[step.type].pure:
            self.dispatch.append(step.id)
        return True

    def run_pure(self, step: Step) -> None:
        """Evaluate `when`, then let the kind start the step (or finish it: a delay or
        wait whose timer made it ready again has its `wake_at`)."""
        state = self.steps[step.id]
        if state.wake_at is None and not self.check_when(step):
            return
        KINDS[step.type].start(self, step)

    def check_when(self, step: Step) -> bool:
        """Whether a step's `when` allows it; skips it (or fails it) if not."""
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

    def record_pure_attempt(self, step_id: str, outcome: str, error: str | None = None) -> None:
        """A pure step's attempt, ended as soon as it began."""
        state = self.steps[step_id]
        state.attempts += 1
        self.new_attempts.append(NewAttempt(step_id, state.fencing_token, None, outcome, error))

    def when_allows(self, step_id: str) -> bool:
        """Check a ready non-pure step's `when` before it is claimed; skips it if false."""
        allowed = self.check_when(self.definition.step(step_id))
        if not allowed:
            self.advance()
        return allowed

    def fail_step(self, step_id: str, error: str) -> None:
        """Fail a step and stop everything that has not started: a failure fails the run,
        paused or not (a request that was in flight when it was paused ends it too).

        An item's step fails its item only; the map's on_item_failure decides the rest."""
        parts = split_item_row(step_id)
        if parts is not None:
            self._fail_item_step(step_id, parts, error)
            return
        self.forget_pause()
        self.set_step(step_id, S.FAILED, error=error, lease_owner=None)
        for other in self.row_ids():
            if self.steps[other].status in CANCELLABLE_STEP:
                self.set_step(other, S.CANCELLED, error=f"not run: step {step_id} failed")
        self.derive_status()

    def _fail_item_step(self, step_id: str, parts: tuple[str, int, str], error: str) -> None:
        map_id, index, _ = parts
        self.set_step(step_id, S.FAILED, error=error, lease_owner=None)
        prefix = f"{map_id}[{index}]."
        for other in [row_id for row_id in self.steps if row_id.startswith(prefix)]:
            if self.steps[other].status in CANCELLABLE_STEP:
                self.set_step(other, S.CANCELLED, error=f"not run: step {step_id} failed")
        self._items_changed()

    def _items_changed(self) -> None:
        """An item ended outside advance(): the map may start the next, fail or end."""
        if self._advancing:
            return  # the advance() under way settles the item
        self.advance()

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
        if outcome.kind == OutcomeKind.SUCCEEDED:
            self.succeed(step_id, outcome.output)
        elif outcome.kind == OutcomeKind.UNKNOWN:
            self.mark_unknown(step_id, outcome.error or "remote effect unknown")
        elif self.stopping(step_id):
            self.set_step(step_id, S.CANCELLED, error=outcome.error, lease_owner=None)
            self.derive_status()
        elif outcome.kind == OutcomeKind.RETRY and self.retry_later(
            step_id, policy, outcome.error or "failed", outcome.retry_after_s
        ):
            return
        elif outcome.kind == OutcomeKind.RETRY and policy.on_exhausted == OnExhausted.PAUSE:
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
            if self.stopping(step_id):
                self.set_step(step_id, S.CANCELLED, error=error, lease_owner=None)
                self.derive_status()
            elif self.retry_later(step_id, step.retry, error):
                pass
            elif step.retry.on_exhausted == OnExhausted.PAUSE:
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
        if self.stopping(step_id):
            self.set_step(step_id, S.CANCELLED, error=error, lease_owner=None)
            self.derive_status()
        elif not self.retry_later(step_id, policy, error):
            self.fail_step(step_id, error)

    def reopen_unknown(self, step_id: str, token: int, worker: str, outcome: str) -> None:
        """The reaper recorded this attempt `unknown` because its lease ran out (a frozen
        worker, an outage longer than the lease), but the worker that sent the request
        holds its answer and no operator has acted on the step: the step is that worker's
        again, for its checkpoint to record the answer like any other
        (docs/contract.md#frozen-processes). The history says who settled it and how."""
        detail = {
            "fencing_token": token,
            "outcome": outcome,
            "actor": {"kind": "worker", "name": worker},
        }
        self.events.append((step_id, EventKind.STEP_SETTLED, detail))
        self.set_step(step_id, S.RUNNING, lease_owner=worker, finished_at=None, error=None)
        self.derive_status()

    def mark_unknown(self, step_id: str, error: str) -> None:
        """The remote effect cannot be known: an operator has to decide. An item left so
        frees its place in its map: the next item starts."""
        self.set_step(step_id, S.UNKNOWN, error=error, lease_owner=None)
        if split_item_row(step_id) is not None:
            self._items_changed()
        self.derive_status()

    def derive_status(self) -> None:
        """Set the execution status from its steps (docs/contract.md#execution-states)."""
        # A running map (`waiting`) stands for its items, whose rows say what happens.
        statuses = {
            state.status
            for state in self.steps.values()
            if state.status != S.WAITING or not KINDS[state.type].holds_rows
        }
        for settled in self.unloaded.values():
            statuses |= settled
        if self.cancel_requested:
            ended = E.FAILED if self.stop_reason == StopReason.DEADLINE else E.CANCELLED
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
        self.forget_pause()
        if status != self.status:
            if self.parent is not None and (
                status in TERMINAL_EXECUTION or E.NEEDS_ATTENTION in (status, self.status)
            ):
                # docs/contract.md#child-workflows: the parent's workflow step takes this in a unit
                # of work of its own (a wake-up written here), never under this execution's lock.
                self.changes.wake_parent = self.parent
            detail = transition(self.status, status)
            if self.stop_reason is not None and status in TERMINAL_EXECUTION:
                detail["reason"] = self.stop_reason
            self.events.append((None, execution_event(status), detail))
            self.status = status
            self.changes.execution_changed = True

    def forget_pause(self) -> None:
        """The execution is no longer paused (what it was and why are cleared)."""
        self.paused_from = None
        self.pause_reason = None

    def started(self) -> None:
        """Leave `queued` when a worker first touches the execution."""
        if self.status == E.QUEUED:
            self.events.append((None, execution_event(E.RUNNING), transition(E.QUEUED, E.RUNNING)))
            self.status = E.RUNNING
            self.changes.execution_changed = True

    def load_rest(self, step_id: str) -> None:
        """Load every row of a step's items that is not loaded yet (see `unloaded`): a row
        this unit of work already holds stays as it is here."""
        if self.unloaded.pop(step_id, None) is None:
            return
        if self.load_items is None:
            raise RuntimeError(f"the settled items of map {step_id!r} were not loaded")
        for state in self.load_items(step_id):
            self.steps.setdefault(state.step_id, state)

    def load_all(self) -> None:
        """Load every map's items: an operator action may change any of them."""
        for step_id in list(self.unloaded):
            self.load_rest(step_id)

    # ---- the definition's rules, for the kinds -----------------------------------------
    # A kind module reaches definitions.py through these, never by importing it: kinds sit
    # below definitions in the import chain (tests/unit/test_architecture.py).

    @staticmethod
    def item_row(map_id: str, index: int, local_id: str) -> str:
        """The row id of a map item's step (`map[3].fetch`)."""
        return item_row(map_id, index, local_id)

    @staticmethod
    def parse_until(text: str) -> datetime:
        """A delay's rendered `until` as a timestamp (ValueError when it is not one)."""
        return parse_until(text)

    @staticmethod
    def admission(definition: Definition, input_value: Any) -> tuple[int, str | None] | str:
        """An execution of `definition` with this input: its priority and concurrency key
        (docs/contract.md#flow-control), or why it cannot be made."""
        try:
            priority = execution_priority(definition, input_value)
        except PriorityInvalid as exc:
            return f"priority: {exc}"
        try:
            return priority, render_concurrency_key(definition, input_value)
        except KeyUnrendered as exc:
            return f"not started: {exc}"

    # ---- a wait step's transitions (kinds/wait.py) -------------------------------------

    def wait_open(self, step_id: str) -> bool:
        """Whether a wait step still takes a resume now: waiting, timeout not passed."""
        return wait.wait_open(self, step_id)

    def wait_not_started(self, step_id: str) -> bool:
        """Whether a resume for this wait step must be kept for later: not ready yet."""
        return wait.wait_not_started(self, step_id)

    def resume(self, step_id: str, body: Any, *, actor: dict[str, Any] | None = None) -> None:
        """End an open wait with `body` as its output; the execution goes on."""
        wait.resume(self, step_id, body, actor=actor)

    def open_event_wait(self, step: Step) -> None:
        """Open a wait step that ends on an event (docs/contract.md#events)."""
        event_waits.open_wait(self, step)

    def receive_event(self, step_id: str, event_id: str, payload: Any) -> None:
        """An open event wait takes an event (docs/contract.md#events)."""
        event_waits.receive(self, step_id, event_id, payload)

    def fail_wait(self, step_id: str, actor: dict[str, Any]) -> None:
        """An operator says the awaited answer is no: the step fails, and so does the run."""
        wait.fail_wait(self, step_id, actor)

    def time_out(self, step_id: str) -> None:
        """No resume came in time: `on_timeout` decides."""
        wait.time_out(self, step_id)

    # ---- operators and time limits (interventions.py) ----------------------------------

    def cancel(self, *, actor: dict[str, Any]) -> None:
        """Stop queued and waiting work now; running steps stop at their next boundary."""
        interventions.cancel(self, actor=actor)

    def stop(self, reason: StopReason | None, error: str, *, actor: dict[str, Any]) -> None:
        """Cancel with a reason kept in the history, with who asked for it."""
        interventions.stop(self, reason, error, actor=actor)

    def pass_deadline(self, *, actor: dict[str, Any] = FLOW_CONTROL_ACTOR) -> None:
        """deadline_s passed: the execution stops and ends `failed` (reason `deadline`)."""
        interventions.pass_deadline(self, actor=actor)

    def expire(self, *, actor: dict[str, Any] = FLOW_CONTROL_ACTOR) -> None:
        """start_within_s passed while queued: it ends `cancelled` (reason `expired`)."""
        interventions.expire(self, actor=actor)

    def enforce_time_limits(self) -> None:
        """Apply a deadline or queue expiry that is due and not applied yet."""
        interventions.enforce_time_limits(self)

    def retry(self, *, actor: dict[str, Any]) -> list[str]:
        """Re-run failed and cancelled steps, keeping every succeeded checkpoint."""
        return interventions.retry(self, actor=actor)

    def resolve(self, step_id: str, outcome: str, output: Any, *, actor: dict[str, Any]) -> None:
        """An operator's verdict on a step whose remote effect was unknown."""
        interventions.resolve(self, step_id, outcome, output, actor=actor)

    def hold(self) -> bool:
        """Whether nothing may start or continue now (docs/contract.md#pause)."""
        return interventions.hold(self)

    def pause(
        self, reason: PauseReason, *, actor: dict[str, Any], detail: dict[str, Any] | None = None
    ) -> None:
        """Hold the execution until it is resumed."""
        interventions.pause(self, reason, actor=actor, detail=detail)

    def pause_exhausted(self, step_id: str, error: str) -> None:
        """retry.on_exhausted "pause": the step failed; the execution waits, paused."""
        interventions.pause_exhausted(self, step_id, error)

    def unpause(self, *, actor: dict[str, Any]) -> list[str]:
        """Resume a paused execution; returns the steps run again."""
        return interventions.unpause(self, actor=actor)

    def fail_paused(self, *, actor: dict[str, Any]) -> None:
        """Give up on an execution paused at a step whose tries ran out."""
        interventions.fail_paused(self, actor=actor)


# The kind of each step type: what the core asks when a step of it is ready, moves on,
# changes or is loaded (kinds/base.py).
KINDS: dict[str, StepKind] = {
    kind.type: kind
    for kind in (
        http_request.KIND,
        transform.KIND,
        delay.KIND,
        wait.KIND,
        map.KIND,
        workflow.KIND,
    )
}
# Steps the worker may run inside the checkpoint transaction: no remote effect, no lease.
PURE_TYPES = frozenset(step_type for step_type, kind in KINDS.items() if kind.pure)


def backoff_seconds(policy: RetryPolicy, attempts_used: int) -> float:
    """Exponential back-off with equal jitter: never zero, never in lock-step."""
    base = policy.initial_interval_s * policy.backoff_coefficient ** max(attempts_used - 1, 0)
    capped = min(base, policy.max_interval_s)
    return capped / 2 + random.uniform(0, capped / 2)


def since_resume(run: Run, step_id: str) -> float | None:
    """Seconds since the wait step `step_id` follows was resumed, when `step_id` starts
    now for the first time (the resume latency); None otherwise. The engine's own rule: a
    resumed (or operator-completed) wait ends succeeded with its wake_at cleared, a
    timed-out one keeps its wake_at."""
    state = run.steps[step_id]
    if state.attempts > 0 or state.started_at is not None:
        return None
    for parent in run.definition.step(step_id).depends_on:
        wait = run.steps[parent]
        if (
            wait.type == StepType.WAIT
            and wait.status == S.SUCCEEDED
            and wait.wake_at is None
            and wait.finished_at is not None
        ):
            return max(0.0, (run.now - wait.finished_at).total_seconds())
    return None
