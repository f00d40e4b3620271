"""The map step (docs/contract.md#map): it runs its body once per item of what `items`
rendered to, at most `max_parallel` items at a time, each item's steps ordinary step rows
of their own (`map[3].fetch`), and gathers their results in order.

While it runs the map is `waiting` and stands for its items (`holds_rows`): their rows say
what the execution is. Its output says how many items it has and how many started, so a
worker's unit of work loads the open items only (store/runs.py) and the rest when the
map needs them all (Run.load_rest): when it ends, starts again, or an operator acts.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flowforge.domain.changes import StepState
from flowforge.domain.kinds.base import Loader, StepKind
from flowforge.domain.model import AttemptOutcome, ItemStatus, OnItemFailure, StepType
from flowforge.domain.model import StepStatus as S
from flowforge.domain.model import item_status as status_of_item
from flowforge.domain.templating import TemplateError, json_type, render

if TYPE_CHECKING:
    from flowforge.domain.definitions import Step
    from flowforge.domain.engine import Run

# How many items a unit of work starts, over all maps: a map of 10,000 pure items would
# otherwise run in one transaction longer than its idle and statement timeouts allow.
# Past it the map is `ready` again with a wake-up of its own, and goes on in the next.
MAP_ITEMS_PER_UNIT = 500
# How an item ended when it makes its map fail once every item ended ("collect").
ITEM_ENDED_BADLY = frozenset({ItemStatus.FAILED, ItemStatus.CANCELLED})


class MapKind(StepKind):
    type = StepType.MAP
    holds_rows = True

    def advance(self, run: Run, step: Step) -> bool:
        """Start a ready map, or move a running one on."""
        if run.steps[step.id].status in (S.READY, S.WAITING):
            return _run_map(run, step)
        return False

    def load(self, run: Run, loader: Loader) -> None:
        """A run loaded with the open items only learns which maps have rows not loaded
        (and which of those rows' statuses count), and how to read them."""
        settled = loader.settled
        if settled is None:
            return
        run.unloaded = {
            step.id: frozenset(settled.get(step.id, ()))
            for step in run.definition.steps
            if step.type == StepType.MAP
        }
        run.load_items = loader.item_rows


@dataclass
class _MapProgress:
    """One map's items during one advance(): each started item's rows (in the order of
    its steps), the items in flight, the items to start next in order."""

    rows: dict[int, list[str]]
    in_flight: set[int] = field(default_factory=set)
    queue: deque[int] = field(default_factory=deque)
    failed: list[int] = field(default_factory=list)  # items found failed when built


@dataclass
class _Scratch:
    """What the maps of one run keep for its unit of work: what each one's `items`
    rendered to (or why it could not) — its inputs are finished steps, which never change
    — each map's progress, rebuilt from the rows in every round of advance(), and how
    many items the unit of work may still start."""

    rendered: dict[str, list[Any] | str] = field(default_factory=dict)
    progress: dict[str, _MapProgress] = field(default_factory=dict)
    budget: int = MAP_ITEMS_PER_UNIT
    round: int = -1


def _scratch(run: Run) -> _Scratch:
    found: _Scratch | None = run.kind_state.get(StepType.MAP)
    if found is None:
        found = run.kind_state[StepType.MAP] = _Scratch()
    if found.round != run.advance_round:
        found.progress.clear()
        found.round = run.advance_round
    return found


def _load_rest(run: Run, map_id: str) -> None:
    """Load the rows of a map's items not loaded yet; its progress is built again."""
    run.load_rest(map_id)
    _scratch(run).progress.pop(map_id, None)


def item_context(run: Run, map_id: str, index: int, local_id: str) -> dict[str, Any]:
    """Template context of an item's step: the map's, with `item`, `index` and the
    finished steps of the item before it."""
    ctx = run.context(map_id)
    step = run.definition.step(map_id)
    items = map_items(run, step)
    ctx["item"] = items[index] if isinstance(items, list) and index < len(items) else None
    ctx["index"] = index
    for ancestor in step.body_ancestors(local_id):
        state = run.steps.get(run.item_row(map_id, index, ancestor))
        if state is not None and state.status == S.SUCCEEDED:
            ctx[ancestor] = state.output
    return ctx


def _run_map(run: Run, step: Step) -> bool:
    """Start a ready map, or move a running one on: start items while fewer than
    max_parallel run, promote and run their steps, and end the map when every item
    has ended. Returns whether anything changed."""
    if run.steps[step.id].status == S.READY:
        if _scratch(run).budget <= 0:
            return False  # it goes on in the unit of work of its own wake-up
        if not run.check_when(step):
            return True
        items = map_items(run, step)
        if isinstance(items, str):
            run.record_pure_attempt(step.id, AttemptOutcome.FAILED, items)
            run.fail_step(step.id, items)
            return True
        # While it runs, a map's output says how many items it has and how many
        # started (the read model counts from it, and a unit of work that loads only
        # the open items knows from it which are next); once it succeeds, their results.
        started = _started(run.steps[step.id].output)
        if started is None:
            # Not known (a first start, or a retry reset it): from every row, once.
            _load_rest(run, step.id)
            started = _rows_started(run, step.id)
        run.set_step(
            step.id,
            S.WAITING,
            output={"items": len(items), "started": started},
            started_at=run.steps[step.id].started_at or run.now,
            reason=f"{len(items)} items, at most {step.max_parallel} at a time",
        )
    progress = _scratch(run).progress.get(step.id) or _map_progress(run, step)
    if progress.failed and step.on_item_failure == OnItemFailure.FAIL_FAST:
        first = progress.failed[0]
        run.fail_step(step.id, f"item {first} failed: {_item_error(run, progress.rows[first])}")
        return True
    moved = False
    for index in sorted(progress.in_flight):
        moved = _step_item(run, step, progress, index) or moved
        if run.steps[step.id].status != S.WAITING:
            return True
    while len(progress.in_flight) < step.max_parallel and progress.queue:
        if _scratch(run).budget <= 0:
            run.set_step(step.id, S.READY, reason="goes on in the next unit of work")
            run.dispatch.append(step.id)
            return True
        _scratch(run).budget -= 1
        index = progress.queue.popleft()
        _admit(run, step, progress, index)
        _step_item(run, step, progress, index)
        moved = True
        if run.steps[step.id].status != S.WAITING:
            return True
    if not progress.in_flight and not progress.queue:
        if step.id in run.unloaded:
            # Every item ended: its results and failures are in the rows not loaded.
            _load_rest(run, step.id)
            return _run_map(run, step) or moved
        moved = _finish_map(run, step, progress) or moved
    return moved


def _map_progress(run: Run, step: Step) -> _MapProgress:
    """A map's items as its rows say: which run, which wait to start (in order)."""
    items = map_items(run, step)
    count = len(items) if isinstance(items, list) else 0
    # Every row is looked at once per advance(), so this stays plain string work.
    rows: dict[int, list[str]] = {}
    prefix = f"{step.id}["
    start = len(prefix)
    for row_id in run.steps:
        if row_id.startswith(prefix):
            index = int(row_id[start : row_id.index("]", start)])
            rows.setdefault(index, []).append(row_id)
    if len(step.body) > 1:
        order = {f".{sub.id}": n for n, sub in enumerate(step.body)}
        for found in rows.values():
            found.sort(key=lambda row_id: order[row_id[row_id.index("].") + 1 :]])
    progress = _MapProgress(rows=rows)
    partial = step.id in run.unloaded
    if partial and (
        _started(run.steps[step.id].output) is None
        or (S.FAILED in run.unloaded[step.id] and step.on_item_failure == OnItemFailure.FAIL_FAST)
    ):
        # Its output does not say how many items started (it started before outputs
        # did), or a failed item was not loaded (the map fails at it, saying which).
        _load_rest(run, step.id)
        return _map_progress(run, step)
    if partial:
        # Only the open items are loaded: the other started ones ended, and the items
        # not started yet are the ones past the started count (items start in order).
        started = max(_started(run.steps[step.id].output) or 0, max(rows, default=-1) + 1)
        indexes: range | list[int] = sorted(rows)
    else:
        started, indexes = count, range(count)
    for index in indexes:
        status = item_status(run, rows[index]) if index in rows else ItemStatus.QUEUED
        if status == ItemStatus.RUNNING:
            progress.in_flight.add(index)
        elif status == ItemStatus.QUEUED:
            progress.queue.append(index)
        elif status == ItemStatus.FAILED:
            progress.failed.append(index)
    progress.queue.extend(range(started, count))
    _scratch(run).progress[step.id] = progress
    return progress


def _rows_started(run: Run, map_id: str) -> int:
    """How many items of a map have rows (items start in order), from the rows loaded."""
    prefix = f"{map_id}["
    start = len(prefix)
    last = -1
    for row_id in run.steps:
        if row_id.startswith(prefix):
            last = max(last, int(row_id[start : row_id.index("]", start)]))
    return last + 1


def _note_started(run: Run, map_id: str, index: int) -> None:
    """Item `index` starts: the map's output says how many items started (no event:
    the map's status does not change)."""
    state = run.steps[map_id]
    if isinstance(state.output, dict) and (_started(state.output) or 0) <= index:
        state.output = {**state.output, "started": index + 1}
        run.changes.steps[map_id] = state


def _admit(run: Run, step: Step, progress: _MapProgress, index: int) -> None:
    """Start an item: its step rows are created now (the first time it starts)."""
    if index not in progress.rows:
        created = []
        for sub in step.body:
            row_id = run.item_row(step.id, index, sub.id)
            state = StepState(row_id, sub.type, S.PENDING)
            run.steps[row_id] = state
            run.changes.steps[row_id] = state
            run.changes.new_steps.append(row_id)
            created.append(row_id)
        progress.rows[index] = created
        _note_started(run, step.id, index)
    progress.in_flight.add(index)


def _step_item(run: Run, step: Step, progress: _MapProgress, index: int) -> bool:
    """Promote and run what an item can run now; settle it when it ended."""
    moved = False
    rows = progress.rows[index]
    for row_id in rows:
        state = run.steps[row_id]
        if state.status == S.PENDING:
            moved = run.promote(run.definition.step(row_id)) or moved
        if state.status == S.READY and run.kind_of(state.type).pure:
            run.run_pure(run.definition.step(row_id))
            moved = True
    status = item_status(run, rows)
    if status != ItemStatus.RUNNING:
        progress.in_flight.discard(index)
        moved = True
        if status == ItemStatus.FAILED and step.on_item_failure == OnItemFailure.FAIL_FAST:
            run.fail_step(step.id, f"item {index} failed: {_item_error(run, rows)}")
    return moved


def _item_error(run: Run, rows: list[str]) -> str:
    for row_id in rows:
        state = run.steps[row_id]
        if state.status == S.FAILED:
            return f"{row_id.rsplit('.', 1)[1]}: {state.error or 'failed'}"
    return "not run"


def _finish_map(run: Run, step: Step, progress: _MapProgress) -> bool:
    """Every item ended: the map succeeds with their results in order, fails when one
    did not succeed (collect), or waits while one needs an operator (`unknown`)."""
    items = map_items(run, step)
    count = len(items) if isinstance(items, list) else 0
    statuses = [
        item_status(run, progress.rows[index]) if index in progress.rows else ItemStatus.QUEUED
        for index in range(count)
    ]
    failed = [n for n, status in enumerate(statuses) if status in ITEM_ENDED_BADLY]
    if failed:
        first = failed[0]
        run.fail_step(
            step.id,
            f"{len(failed)} of {count} items did not succeed (first: item {first}: "
            f"{_item_error(run, progress.rows.get(first, []))})",
        )
        return True
    if any(status != ItemStatus.SUCCEEDED for status in statuses):
        return False  # an item needs an operator: the map waits for the verdict
    last = step.body[-1].id
    output = [run.steps[run.item_row(step.id, n, last)].output for n in range(count)]
    run.set_step(step.id, S.SUCCEEDED, output=output, error=None)
    return True


def map_items(run: Run, step: Step) -> list[Any] | str:
    """What a map's `items` renders to, or why it cannot run: not an array, or more
    items than the cap (docs/contract.md#map)."""
    found = _scratch(run).rendered.get(step.id)
    if found is not None:
        return found
    try:
        value = render(step.items, run.context(step.id))
    except TemplateError as exc:
        found = f"items: {exc}"
    else:
        if not isinstance(value, list):
            found = f"items rendered to a {json_type(value)}, not an array"
        elif len(value) > run.max_map_items:
            found = (
                f"items rendered to {len(value)} items, above the cap of "
                f"{run.max_map_items} items per map"
            )
        else:
            found = value
    _scratch(run).rendered[step.id] = found
    return found


def item_status(run: Run, row_ids: list[str]) -> str:
    """One item's status from its steps' rows (ItemStatus)."""
    steps = run.steps
    return status_of_item({str.__str__(steps[row_id].status) for row_id in row_ids})


def _started(output: Any) -> int | None:
    """How many items a running (or stopped) map started, as its output says; None when
    it does not say."""
    if isinstance(output, dict) and isinstance(output.get("started"), int):
        return int(output["started"])
    return None


KIND = MapKind()
