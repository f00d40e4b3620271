"""The interface between the engine's core and a step kind (docs/architecture.md#the-engine).

The core (flowforge/domain/engine.py) owns what every step has: its status and history,
its dependencies and `when`, its attempts, retries and lease, the execution's status. What
a step *does* is its kind's, and the core asks it through four hooks, each with a default
that does nothing, so a kind writes only the ones it needs (as dramatiq's middleware
does): `advance` (in every pass of Run.advance: start a ready step, or move a waiting one
on), `start` (a ready pure step whose `when` allows it), `changed` (after one of its
steps changed status) and `load` (what rows it needs beside the steps, read through the
store's `Loader`). A kind module imports the model and templating, never
definitions.py: what it needs of the definition's rules it reaches through the run, which
keeps the import chain short (tests/unit/test_architecture.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from flowforge.domain.model import StepStatus as S
from flowforge.domain.model import StepType

if TYPE_CHECKING:
    from flowforge.domain.changes import StepState
    from flowforge.domain.definitions import Step
    from flowforge.domain.engine import Run
    from flowforge.domain.event_waits import EventPort
    from flowforge.domain.kinds.workflow import ChildState, ChildTarget


class Loader(Protocol):
    """What a kind may read, beside the steps, in the unit of work that loads its run
    (store/runs.py implements it over the locked transaction)."""

    @property
    def settled(self) -> dict[str, set[str]] | None:
        """For a run loaded with a map's open items only: each map's statuses among its
        settled items' rows that are neither succeeded nor skipped; None: all loaded."""

    def item_rows(self, map_id: str) -> list[StepState]:
        """Every row of a map's items."""

    def early_resumes(self) -> dict[str, Any]:
        """Resumes kept for wait steps not started yet (step id -> body)."""

    def event_port(self) -> EventPort:
        """The events a wait opening in this unit of work may take (domain/event_waits.py)."""

    def children(self) -> dict[str, ChildState]:
        """Each workflow step's newest child execution."""

    def child_limits(self) -> tuple[int, int]:
        """FLOWFORGE_MAX_CHILD_DEPTH and FLOWFORGE_MAX_DESCENDANTS."""

    def descendants(self, root_id: str) -> int:
        """How many executions a root has below it (its tree stays locked)."""

    def child_targets(self, keys: tuple[str, ...]) -> dict[str, ChildTarget | None]:
        """The newest version of each workflow a workflow step may start (None: none)."""

    def new_execution_id(self) -> str:
        """A new execution's id, as the store makes them."""


class StepKind:
    """A step kind as the core sees it. `pure`: it runs inside the checkpoint
    transaction (no lease, no broker round trip); `holds_rows`: while `waiting` it stands
    for rows of its own (a map's items), whose statuses count for the execution instead."""

    type: ClassVar[StepType]
    pure: ClassVar[bool] = True
    holds_rows: ClassVar[bool] = False

    def advance(self, run: Run, step: Step) -> bool:
        """One pass of Run.advance() over a step of this kind that is not pending: by
        default a ready pure step starts. Returns whether anything changed."""
        if self.pure and run.steps[step.id].status == S.READY:
            run.run_pure(step)
            return True
        return False

    def start(self, run: Run, step: Step) -> None:
        """A ready pure step whose `when` allows it (or one its timer made ready again)."""

    def changed(self, run: Run, state: StepState, previous: str) -> None:
        """One of its steps went from `previous` to `state.status` (Run.set_step)."""

    def load(self, run: Run, loader: Loader) -> None:
        """Read what this kind needs into a run just loaded (store/runs.load_run); asked
        only when the run's workflow has a step of this kind."""
