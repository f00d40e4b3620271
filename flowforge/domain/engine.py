"""DAG progression of one execution, as pure Python over its loaded rows.

Every change to an execution happens in a unit of work: load the execution and its steps
under the execution row lock, change a `Run` in memory, save what changed in the same
transaction. Keeping the rules here, free of SQL and I/O, lets the worker, the reaper,
the timer scanner and operator actions share one set of transitions, and lets unit tests
drive them without a database.

What operator actions do to steps (docs/contract.md#outcomes-stick: no operator action silently
repeats an unsafe request):

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
- A deadline (docs/contract.md#deadline) stops the execution like a cancel, except that it ends
  `failed` with reason `deadline`; a queue expiry (`start_within_s`) and `cancel_oldest` end it
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
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from flowforge.domain import inputschema
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
from flowforge.domain.model import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_CHILD_DEPTH,
    DEFAULT_MAX_DESCENDANTS,
    FLOW_CONTROL_ACTOR,
    RETRIED_STEP,
    TERMINAL_EXECUTION,
    WORKFLOW_PAUSE_ACTOR,
    AttemptOutcome,
    EventKind,
    ItemStatus,
    OnExhausted,
    OnTimeout,
    Outcome,
    OutcomeKind,
    PauseReason,
    StepType,
    execution_event,
    item_status,
    step_event,
    transition,
)
from flowforge.domain.model import ExecutionStatus as E
from flowforge.domain.model import StepStatus as S
from flowforge.domain.templating import TemplateError, evaluate_condition, json_type, render

DONE_STEP = frozenset({S.SUCCEEDED, S.SKIPPED})
FINAL_STEP = frozenset({S.SUCCEEDED, S.FAILED, S.SKIPPED, S.CANCELLED})
# Steps that may still change without an operator: they keep an execution alive.
ACTIVE_STEP = frozenset({S.READY, S.RUNNING, S.WAITING})
# Cancel stops these at once; `running` steps stop at their next boundary.
CANCELLABLE_STEP = frozenset({S.PENDING, S.READY, S.WAITING})
# Steps the worker may run inside the checkpoint transaction: no remote effect, no lease.
# A map (docs/contract.md#map) is one: it starts its items' steps and gathers their results, each of
# them an ordinary step row of its own.
# A workflow step (docs/contract.md#child-workflows) is one too: it creates its child execution in
# the unit of work that starts it and waits, holding no thread, until the child's end wakes it.
PURE_TYPES = frozenset(
    {StepType.TRANSFORM, StepType.DELAY, StepType.WAIT, StepType.MAP, StepType.WORKFLOW}
)
# What a paused execution was (and resume gives back), docs/contract.md#pause.
PAUSABLE_EXECUTION = frozenset({E.QUEUED, E.RUNNING, E.WAITING, E.NEEDS_ATTENTION})


# How many items a unit of work starts, over all maps: a map of 10,000 pure items would
# otherwise run in one transaction longer than its idle and statement timeouts allow.
# Past it the map is `ready` again with a wake-up of its own, and goes on in the next.
MAP_ITEMS_PER_UNIT = 500
# How an item ended when it makes its map fail once every item ended ("collect").
ITEM_ENDED_BADLY = frozenset({ItemStatus.FAILED, ItemStatus.CANCELLED})


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
    status: str
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


@dataclass
class _MapProgress:
    """One map's items during one advance(): each started item's rows (in the order of
    its steps), the items in flight, the items to start next in order."""

    rows: dict[int, list[str]]
    in_flight: set[int] = field(default_factory=set)
    queue: deque[int] = field(default_factory=deque)
    failed: list[int] = field(default_factory=list)  # items found failed when built


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
    # The concurrency slot this unit of work freed (docs/contract.md#slots): runs.save_run hands it
    # to the next queued execution of the key in the same transaction.
    released_slot: tuple[int, str] | None = None
    # Wait steps that took their early resume: saving marks those resumes applied.
    applied_resumes: list[str] = field(default_factory=list)
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
    # Flow control (docs/contract.md#flow-control): why a stop was asked, the execution's
    # concurrency key and whether it held a slot when loaded (a slot frees when it is terminal,
    # docs/contract.md#slots), and whether its deadline or queue expiry had passed by the
    # transaction's now().
    stop_reason: str | None = None
    workflow_id: int = 0
    concurrency_key: str | None = None
    held_slot: bool = False
    deadline_passed: bool = False
    expired: bool = False
    # Resumes recorded before their wait step was ready (step id -> body); loaded only for
    # workflows with wait steps, taken (Changes.applied_resumes) when the step starts.
    early_resumes: dict[str, Any] = field(default_factory=dict)
    # Pause (docs/contract.md#pause): what the execution was when paused and why (both None unless
    # it is `paused`), and whether its workflow is paused, by whom (the actor of the pause).
    paused_from: str | None = None
    pause_reason: str | None = None
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
    # Maps (docs/contract.md#map): what each one's `items` rendered to (or why it could not), kept
    # for the unit of work — its inputs are finished steps, which never change — and each
    # map's progress, rebuilt from the rows at every advance().
    _rendered_items: dict[str, list[Any] | str] = field(init=False, repr=False)
    _maps: dict[str, _MapProgress] = field(init=False, repr=False)
    _advancing: bool = field(init=False, repr=False)
    _item_budget: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.changes = Changes(self.execution_id)
        self._rendered_items, self._maps, self._advancing = {}, {}, False
        self._item_budget = MAP_ITEMS_PER_UNIT

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
            return self._item_context(*parts)
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

    def _item_context(self, map_id: str, index: int, local_id: str) -> dict[str, Any]:
        ctx = self.context(map_id)
        step = self.definition.step(map_id)
        items = self.map_items(step)
        ctx["item"] = items[index] if isinstance(items, list) and index < len(items) else None
        ctx["index"] = index
        for ancestor in step.body_ancestors(local_id):
            state = self.steps.get(item_row(map_id, index, ancestor))
            if state is not None and state.status == S.SUCCEEDED:
                ctx[ancestor] = state.output
        return ctx

    def map_items(self, step: Step) -> list[Any] | str:
        """What a map's `items` renders to, or why it cannot run: not an array, or more
        items than the cap (docs/contract.md#map)."""
        found = self._rendered_items.get(step.id)
        if found is not None:
            return found
        try:
            value = render(step.items, self.context(step.id))
        except TemplateError as exc:
            found = f"items: {exc}"
        else:
            if not isinstance(value, list):
                found = f"items rendered to a {json_type(value)}, not an array"
            elif len(value) > MAX_MAP_ITEMS:
                found = (
                    f"items rendered to {len(value)} items, above the cap of "
                    f"{MAX_MAP_ITEMS} items per map"
                )
            else:
                found = value
        self._rendered_items[step.id] = found
        return found

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
        if state.type == StepType.WORKFLOW and previous == S.WAITING and status == S.CANCELLED:
            self._cancel_child(step_id)
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
        outermost, self._advancing = not self._advancing, True
        if outermost:
            self._maps = {}
        try:
            moved = True
            while moved:
                moved = False
                for step in self.definition.steps:
                    state = self.steps[step.id]
                    if state.status == S.PENDING and self._promote(step):
                        moved = True
                    status = self.steps[step.id].status
                    if step.type == "map" and status in (S.READY, S.WAITING):
                        moved = self._run_map(step) or moved
                    elif step.type == StepType.WORKFLOW and status == S.WAITING:
                        moved = self._check_child(step) or moved
                    elif status == S.READY and step.type in PURE_TYPES:
                        self._run_pure(step)
                        moved = True
        finally:
            self._advancing = not outermost
        self.derive_status()

    # ---- maps (docs/contract.md#map) -------------------------------------------------------------

    def _run_map(self, step: Step) -> bool:
        """Start a ready map, or move a running one on: start items while fewer than
        max_parallel run, promote and run their steps, and end the map when every item
        has ended. Returns whether anything changed."""
        if self.steps[step.id].status == S.READY:
            if self._item_budget <= 0:
                return False  # it goes on in the unit of work of its own wake-up
            if not self._when_allows(step):
                return True
            items = self.map_items(step)
            if isinstance(items, str):
                self._record_pure_attempt(step.id, AttemptOutcome.FAILED, items)
                self.fail_step(step.id, items)
                return True
            # While it runs, a map's output says how many items it has and how many
            # started (the read model counts from it, and a unit of work that loads only
            # the open items knows from it which are next); once it succeeds, their results.
            started = _started(self.steps[step.id].output)
            if started is None:
                # Not known (a first start, or a retry reset it): from every row, once.
                self._load_rest(step.id)
                started = self._rows_started(step.id)
            self.set_step(
                step.id,
                S.WAITING,
                output={"items": len(items), "started": started},
                started_at=self.steps[step.id].started_at or self.now,
                reason=f"{len(items)} items, at most {step.max_parallel} at a time",
            )
        progress = self._maps.get(step.id) or self._map_progress(step)
        if progress.failed and step.on_item_failure == "fail_fast":
            first = progress.failed[0]
            self.fail_step(
                step.id, f"item {first} failed: {self._item_error(progress.rows[first])}"
            )
            return True
        moved = False
        for index in sorted(progress.in_flight):
            moved = self._step_item(step, progress, index) or moved
            if self.steps[step.id].status != S.WAITING:
                return True
        while len(progress.in_flight) < step.max_parallel and progress.queue:
            if self._item_budget <= 0:
                self.set_step(step.id, S.READY, reason="goes on in the next unit of work")
                self.dispatch.append(step.id)
                return True
            self._item_budget -= 1
            index = progress.queue.popleft()
            self._admit(step, progress, index)
            self._step_item(step, progress, index)
            moved = True
            if self.steps[step.id].status != S.WAITING:
                return True
        if not progress.in_flight and not progress.queue:
            if step.id in self.unloaded:
                # Every item ended: its results and failures are in the rows not loaded.
                self._load_rest(step.id)
                return self._run_map(step) or moved
            moved = self._finish_map(step, progress) or moved
        return moved

    def _map_progress(self, step: Step) -> _MapProgress:
        """A map's items as its rows say: which run, which wait to start (in order)."""
        items = self.map_items(step)
        count = len(items) if isinstance(items, list) else 0
        # Every row is looked at once per advance(), so this stays plain string work.
        rows: dict[int, list[str]] = {}
        prefix = f"{step.id}["
        start = len(prefix)
        for row_id in self.steps:
            if row_id.startswith(prefix):
                index = int(row_id[start : row_id.index("]", start)])
                rows.setdefault(index, []).append(row_id)
        if len(step.body) > 1:
            order = {f".{sub.id}": n for n, sub in enumerate(step.body)}
            for found in rows.values():
                found.sort(key=lambda row_id: order[row_id[row_id.index("].") + 1 :]])
        progress = _MapProgress(rows=rows)
        partial = step.id in self.unloaded
        if partial and (
            _started(self.steps[step.id].output) is None
            or (S.FAILED in self.unloaded[step.id] and step.on_item_failure == "fail_fast")
        ):
            # Its output does not say how many items started (it started before outputs
            # did), or a failed item was not loaded (the map fails at it, saying which).
            self._load_rest(step.id)
            return self._map_progress(step)
        if partial:
            # Only the open items are loaded: the other started ones ended, and the items
            # not started yet are the ones past the started count (items start in order).
            started = max(_started(self.steps[step.id].output) or 0, max(rows, default=-1) + 1)
            indexes: range | list[int] = sorted(rows)
        else:
            started, indexes = count, range(count)
        for index in indexes:
            status = self.item_status(rows[index]) if index in rows else ItemStatus.QUEUED
            if status == ItemStatus.RUNNING:
                progress.in_flight.add(index)
            elif status == ItemStatus.QUEUED:
                progress.queue.append(index)
            elif status == ItemStatus.FAILED:
                progress.failed.append(index)
        progress.queue.extend(range(started, count))
        self._maps[step.id] = progress
        return progress

    def _load_rest(self, map_id: str) -> None:
        """Load every row of a map's items that is not loaded yet (see `unloaded`): a row
        this unit of work already holds stays as it is here."""
        if self.unloaded.pop(map_id, None) is None:
            return
        if self.load_items is None:
            raise RuntimeError(f"the settled items of map {map_id!r} were not loaded")
        for state in self.load_items(map_id):
            self.steps.setdefault(state.step_id, state)
        self._maps.pop(map_id, None)

    def _load_all(self) -> None:
        """Load every map's items: an operator action may change any of them."""
        for map_id in list(self.unloaded):
            self._load_rest(map_id)

    def _rows_started(self, map_id: str) -> int:
        """How many items of a map have rows (items start in order), from the rows loaded."""
        prefix = f"{map_id}["
        start = len(prefix)
        last = -1
        for row_id in self.steps:
            if row_id.startswith(prefix):
                last = max(last, int(row_id[start : row_id.index("]", start)]))
        return last + 1

    def _note_started(self, map_id: str, index: int) -> None:
        """Item `index` starts: the map's output says how many items started (no event:
        the map's status does not change)."""
        state = self.steps[map_id]
        if isinstance(state.output, dict) and (_started(state.output) or 0) <= index:
            state.output = {**state.output, "started": index + 1}
            self.changes.steps[map_id] = state

    def item_status(self, row_ids: list[str]) -> str:
        """One item's status from its steps' rows (ItemStatus)."""
        steps = self.steps
        return item_status({str.__str__(steps[row_id].status) for row_id in row_ids})

    def _admit(self, step: Step, progress: _MapProgress, index: int) -> None:
        """Start an item: its step rows are created now (the first time it starts)."""
        if index not in progress.rows:
            created = []
            for sub in step.body:
                row_id = item_row(step.id, index, sub.id)
                state = StepState(row_id, sub.type, S.PENDING)
                self.steps[row_id] = state
                self.changes.steps[row_id] = state
                self.changes.new_steps.append(row_id)
                created.append(row_id)
            progress.rows[index] = created
            self._note_started(step.id, index)
        progress.in_flight.add(index)

    def _step_item(self, step: Step, progress: _MapProgress, index: int) -> bool:
        """Promote and run what an item can run now; settle it when it ended."""
        moved = False
        rows = progress.rows[index]
        for row_id in rows:
            state = self.steps[row_id]
            if state.status == S.PENDING:
                moved = self._promote(self.definition.step(row_id)) or moved
            if state.status == S.READY and state.type in PURE_TYPES:
                self._run_pure(self.definition.step(row_id))
                moved = True
        status = self.item_status(rows)
        if status != ItemStatus.RUNNING:
            progress.in_flight.discard(index)
            moved = True
            if status == ItemStatus.FAILED and step.on_item_failure == "fail_fast":
                self.fail_step(step.id, f"item {index} failed: {self._item_error(rows)}")
        return moved

    def _item_error(self, rows: list[str]) -> str:
        for row_id in rows:
            state = self.steps[row_id]
            if state.status == S.FAILED:
                return f"{row_id.rsplit('.', 1)[1]}: {state.error or 'failed'}"
        return "not run"

    def _finish_map(self, step: Step, progress: _MapProgress) -> bool:
        """Every item ended: the map succeeds with their results in order, fails when one
        did not succeed (collect), or waits while one needs an operator (`unknown`)."""
        items = self.map_items(step)
        count = len(items) if isinstance(items, list) else 0
        statuses = [
            self.item_status(progress.rows[index]) if index in progress.rows else ItemStatus.QUEUED
            for index in range(count)
        ]
        failed = [n for n, status in enumerate(statuses) if status in ITEM_ENDED_BADLY]
        if failed:
            first = failed[0]
            self.fail_step(
                step.id,
                f"{len(failed)} of {count} items did not succeed (first: item {first}: "
                f"{self._item_error(progress.rows.get(first, []))})",
            )
            return True
        if any(status != ItemStatus.SUCCEEDED for status in statuses):
            return False  # an item needs an operator: the map waits for the verdict
        last = step.body[-1].id
        output = [self.steps[item_row(step.id, n, last)].output for n in range(count)]
        self.set_step(step.id, S.SUCCEEDED, output=output, error=None)
        return True

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
        if step.type == StepType.WAIT:
            self._run_wait(step)
        elif step.type == StepType.TRANSFORM:
            self._run_transform(step)
        elif step.type == StepType.DELAY:
            self._run_delay(step)
        elif step.type == StepType.WORKFLOW:
            self._start_child(step)

    # ---- child workflows (docs/contract.md#child-workflows) --------------------------------------

    def _start_child(self, step: Step) -> None:
        """Start a workflow step: its child execution is created in this unit of work
        (Changes.child_starts, keyed by the step's round) and the step waits for it."""
        assert step.workflow is not None
        state = self.steps[step.id]
        try:
            child_input = render(step.child_input, self.context(step.id))
        except TemplateError as exc:
            self._child_refused(step.id, f"input: {exc}")
            return
        depth = self.depth + 1
        target = self.child_targets.get(step.workflow)
        if depth > self.max_child_depth:
            self._child_refused(
                step.id,
                f"not started: a child of this execution would be at depth {depth}, beyond"
                f" FLOWFORGE_MAX_CHILD_DEPTH {self.max_child_depth} (do workflows call each"
                " other in a cycle?)",
            )
            return
        if target is None:
            self._child_refused(
                step.id, f"not started: workflow {step.workflow!r} does not exist or is archived"
            )
            return
        root = self.root_id or self.execution_id
        if self.descendants + len(self.changes.child_starts) >= self.max_descendants:
            self._child_refused(
                step.id,
                f"not started: root execution {root} already has {self.max_descendants} "
                f"executions below it, FLOWFORGE_MAX_DESCENDANTS {self.max_descendants}",
            )
            return
        if target.definition.input_schema is not None:
            try:
                checker = inputschema.validator(target.definition.input_schema)
                inputschema.check(checker, child_input)
            except inputschema.InputInvalid as exc:
                paths = ", ".join(e["path"] for e in (exc.errors or [])[:5])
                self._child_refused(step.id, f"input: {exc} ({paths})")
                return
            except inputschema.InputTooLarge as exc:
                self._child_refused(step.id, f"input: {exc}")
                return
        try:
            # The child's own definition says its priority, as for any execution of it.
            priority = execution_priority(target.definition, child_input)
        except PriorityInvalid as exc:
            self._child_refused(step.id, f"priority: {exc}")
            return
        try:
            # A flow-controlled child (docs/contract.md#flow-control) is admitted by its key when it
            # is saved.
            ckey = render_concurrency_key(target.definition, child_input)
        except KeyUnrendered as exc:
            self._child_refused(step.id, f"not started: {exc}")
            return
        child_id = self.new_id()
        key = child_key(self.execution_id, step.id, state.fencing_token)
        self.changes.child_starts.append(
            ChildStart(
                step.id,
                child_id,
                key,
                step.workflow,
                target,
                child_input,
                depth,
                priority,
                root,
                ckey,
            )
        )
        link = {"execution_id": child_id, "workflow": step.workflow, "version": target.version}
        self.events.append((step.id, EventKind.CHILD_STARTED, dict(link)))
        self.children[step.id] = ChildState(child_id, E.QUEUED)
        self.set_step(
            step.id,
            S.WAITING,
            output=link,
            started_at=state.started_at or self.now,
            reason=f"waiting for execution {child_id} of {step.workflow}",
        )

    def _child_refused(self, step_id: str, error: str) -> None:
        self._record_pure_attempt(step_id, AttemptOutcome.FAILED, error)
        self.fail_step(step_id, error)

    def child_of(self, step_id: str) -> ChildState | None:
        """The child a waiting workflow step waits for (None: none, or not this round's)."""
        state = self.steps[step_id]
        child = self.children.get(step_id)
        expected = state.output.get("execution_id") if isinstance(state.output, dict) else None
        if child is None or child.execution_id != expected:
            return None
        return child

    def _check_child(self, step: Step) -> bool:
        """A waiting workflow step takes its child's end: its output when it succeeded, a
        failure when it failed or was cancelled. A child that needs an operator keeps the
        step waiting, saying so (its error), until the child goes on. Returns whether
        anything changed."""
        state = self.steps[step.id]
        child = self.child_of(step.id)
        if child is None:
            return False
        ended = {"execution_id": child.execution_id, "status": str(child.status)}
        if child.status == E.SUCCEEDED:
            self._record_pure_attempt(step.id, AttemptOutcome.SUCCEEDED)
            self.events.append((step.id, EventKind.CHILD_ENDED, ended))
            self.set_step(step.id, S.SUCCEEDED, output=child.output, error=None)
            return True
        if child.status in (E.FAILED, E.CANCELLED):
            error = f"child execution {child.execution_id} of {step.workflow} {child.status}"
            if child.error:
                error += f": {child.error}"
            self._record_pure_attempt(step.id, AttemptOutcome.FAILED, error)
            self.events.append((step.id, EventKind.CHILD_ENDED, ended))
            self.fail_step(step.id, error)
            return True
        attention = child.status == E.NEEDS_ATTENTION
        if attention and state.error is None:
            self.events.append(
                (step.id, EventKind.CHILD_NEEDS_ATTENTION, {"execution_id": child.execution_id})
            )
            self.set_step(
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
            self.set_step(step.id, S.WAITING, error=None, reason="the child goes on")
            return True
        return False

    def _cancel_child(self, step_id: str) -> None:
        """A waiting workflow step was cancelled: so is its child, by the cancel rules."""
        child = self.child_of(step_id)
        if child is not None and child.status not in TERMINAL_EXECUTION:
            self.changes.child_cancels.append(child.execution_id)

    def _run_transform(self, step: Step) -> None:
        """Render a transform's output: its one attempt succeeds or fails at once."""
        try:
            output = render(step.output, self.context(step.id))
        except TemplateError as exc:
            self._record_pure_attempt(step.id, AttemptOutcome.FAILED, str(exc))
            self.fail_step(step.id, str(exc))
            return
        self._record_pure_attempt(step.id, AttemptOutcome.SUCCEEDED)
        self.set_step(step.id, S.SUCCEEDED, output=output, started_at=self.now)

    def _run_delay(self, step: Step) -> None:
        """Start a delay (done at once if its time has come), or end it: its time came."""
        state = self.steps[step.id]
        if state.wake_at is None:
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
        if step.on_timeout == OnTimeout.CONTINUE:
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
        paused or not (a request that was in flight when it was paused ends it too).

        An item's step fails its item only; the map's on_item_failure decides the rest."""
        parts = split_item_row(step_id)
        if parts is not None:
            self._fail_item_step(step_id, parts, error)
            return
        self._forget_pause()
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
        for step_id in self.row_ids():
            if self.steps[step_id].status in CANCELLABLE_STEP:
                self.set_step(step_id, S.CANCELLED, error=error, reason=reason)
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
        self._load_all()
        self.cancel_requested = False
        self.stop_reason = None
        rerun = [row for row in self.row_ids() if self.steps[row].status in RETRIED_STEP]
        for step_id in rerun:
            # A resume kept for a wait of the last round does not carry over to the new one
            # (actions.retry deletes its row).
            self.early_resumes.pop(step_id, None)
            self.set_step(
                step_id,
                S.PENDING,
                attempts=0,
                # A new round: a retried wait step reopens under a new resume URL
                # (flowforge/store/waits.py), and any late write of the old round is fenced off.
                fencing_token=self.steps[step_id].fencing_token + 1,
                error=None,
                wake_at=None,
                output=None,
                started_at=None,  # budget_s counts from the first attempt of this run
                finished_at=None,
            )
        self.status = E.RUNNING
        self.changes.execution_changed = True
        retried: dict[str, Any] = {"steps": [row for row in rerun if "[" not in row]}
        if len(retried["steps"]) < len(rerun):
            # A map's items: how many of their steps run again, not thousands of ids.
            retried["item_steps"] = len(rerun) - len(retried["steps"])
        self.events.append((None, EventKind.EXECUTION_RETRIED, {**retried, "actor": dict(actor)}))
        self.advance()
        return rerun

    def resolve(self, step_id: str, outcome: str, output: Any, *, actor: dict[str, Any]) -> None:
        """An operator's verdict on a step whose remote effect was unknown."""
        self._load_all()
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
        """Set the execution status from its steps (docs/contract.md#execution-states)."""
        # A running map (`waiting`) stands for its items, whose rows say what happens.
        statuses = {
            state.status
            for state in self.steps.values()
            if state.type != "map" or state.status != S.WAITING
        }
        for settled in self.unloaded.values():
            statuses |= settled
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

    # ---- pause and resume (docs/contract.md#pause) -----------------------------------------------

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
        self._load_all()
        was = self.paused_from or E.RUNNING
        rerun = [row for row in self.row_ids() if self._tries_ran_out(row)]
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
        for step_id in self.row_ids():
            state = self.steps[step_id]
            ready = state.status == S.READY
            if ready and state.type not in PURE_TYPES and step_id not in self.dispatch:
                self.dispatch.append(step_id)
        self.advance()
        return rerun

    def _tries_ran_out(self, step_id: str) -> bool:
        """Whether a step is `failed` because its tries ran out under `on_exhausted:
        pause` — what a resume runs again. Not any failed step: a map's item that failed
        for good (a 4xx, a 503 to an unsafe POST, no retry policy) leaves the map and its
        execution running under `collect`, so the execution can be paused and resumed
        with it failed, and running it again would re-send an unsafe request nobody asked
        for (soak seed 2344)."""
        state = self.steps[step_id]
        if state.status != S.FAILED:
            return False
        policy = self.definition.step(step_id).retry
        return policy.on_exhausted == OnExhausted.PAUSE and state.attempts >= policy.max_attempts

    def fail_paused(self, *, actor: dict[str, Any]) -> None:
        """An operator gives up on an execution paused at a step whose tries ran out: it
        fails as it would have under on_exhausted "fail"."""
        self._load_all()
        failed = [row for row in self.row_ids() if self.steps[row].status == S.FAILED]
        name = actor.get("name", "an operator")
        self.events.append((None, EventKind.FAIL_REQUESTED, {"actor": dict(actor)}))
        if failed:
            # An item's failure is settled by its map, which a pause would hold.
            self._forget_pause()
            self.changes.execution_changed = True
        for step_id in failed:
            error = self.steps[step_id].error or "failed"
            self.fail_step(step_id, f"{error}; failed by {name} while paused")

    def started(self) -> None:
        """Leave `queued` when a worker first touches the execution."""
        if self.status == E.QUEUED:
            self.events.append((None, execution_event(E.RUNNING), transition(E.QUEUED, E.RUNNING)))
            self.status = E.RUNNING
            self.changes.execution_changed = True


def _started(output: Any) -> int | None:
    """How many items a running (or stopped) map started, as its output says; None when
    it does not say."""
    if isinstance(output, dict) and isinstance(output.get("started"), int):
        return int(output["started"])
    return None


def backoff_seconds(policy: RetryPolicy, attempts_used: int) -> float:
    """Exponential back-off with equal jitter: never zero, never in lock-step."""
    base = policy.initial_interval_s * policy.backoff_coefficient ** max(attempts_used - 1, 0)
    capped = min(base, policy.max_interval_s)
    return capped / 2 + random.uniform(0, capped / 2)


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
