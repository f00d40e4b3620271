"""What a valid definition is made of: the closed sets its fields take and the frozen
dataclasses the parser builds (docs/contract.md#definition). Nothing here validates: the
parser's sections do (flowforge/domain/definitions/__init__.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from flowforge.domain import cron
from flowforge.domain.definitions.bounds import (
    DEFAULT_CATCHUP_WINDOW_S,
    DEFAULT_MAP_PARALLEL,
    DEFAULT_PRIORITY,
    DEFAULT_RETENTION_DAYS,
    MAX_HOLD_S,
)
from flowforge.domain.definitions.graph import closure
from flowforge.domain.model import (
    ConditionOp,
    HttpMethod,
    ItemFailure,
    OnExhausted,
    OnFull,
    OnTimeout,
    Overlap,
    ResumeAuth,
    StepType,
)

STEP_TYPES = tuple(StepType)
# docs/contract.md#map: the step types a map's items may run (no nested map, no wait: a resume URL
# per item is not part of the contract).
ITEM_STEP_TYPES = (StepType.HTTP_REQUEST, StepType.DELAY, StepType.TRANSFORM)
ON_ITEM_FAILURE = tuple(ItemFailure)
# Names an item's steps read besides their siblings: the item and its position.
ITEM_NAMES = frozenset({"item", "index"})
METHODS = tuple(HttpMethod)
SAFE_METHODS = frozenset(
    {HttpMethod.GET, HttpMethod.HEAD, HttpMethod.OPTIONS, HttpMethod.PUT, HttpMethod.DELETE}
)
OPS = tuple(ConditionOp)
RESERVED_NAMES = frozenset({"input", "execution", "secrets", "waits"})
ON_TIMEOUT = tuple(OnTimeout)
RESUME_AUTH = tuple(ResumeAuth)
EXECUTION_FIELDS = ("id", "workflow", "version")
# A definition's on_full choices (the others are a schedule's overlap policies).
ON_FULL = (OnFull.QUEUE, OnFull.DROP_NEW, OnFull.CANCEL_OLDEST)
OVERLAP = tuple(Overlap)
# retry.on_exhausted's choices.
ON_EXHAUSTED = tuple(OnExhausted)

STEP_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# The row of one item's step of a map (docs/contract.md#map): `lines[12].reserve`. Neither '[' nor
# '.' may appear in a step id, so an item's row never collides with a step of the workflow.
ITEM_ROW = re.compile(
    r"([A-Za-z_][A-Za-z0-9_]{0,63})\[([0-9]{1,9})\]\.([A-Za-z_][A-Za-z0-9_]{0,63})"
)
# A limit an operator shares between named workflows (FLOWFORGE_SHARED_LIMITS): a
# definition opts in with {"shared": NAME} and no bounds of its own.
SHARED_LIMIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# The concurrency key of a schedule's ticks (docs/contract.md#schedules): no rendered key may take
# it.
SCHEDULE_KEY = "@schedule"


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failed HTTP attempt is tried again."""

    max_attempts: int = 3
    initial_interval_s: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval_s: float = 300.0
    # docs/contract.md#on-exhausted: what a step whose tries ran out does to its execution: `fail`
    # it, or `pause` it for an operator (who resumes it to run the step again, or fails it).
    on_exhausted: OnExhausted = OnExhausted.FAIL


@dataclass(frozen=True)
class Concurrency:
    """How many executions (of one key value) may hold a slot, and what a full one does."""

    limit: int
    key: str | None = None  # a template over `input`; None: one queue for the workflow
    on_full: OnFull = OnFull.QUEUE
    max_queued: int | None = None


@dataclass(frozen=True)
class Circuit:
    """A circuit breaker (docs/contract.md#circuits): `failures` connection failures or 5xx in a row
    within `window_s` open it for `cool_down_s`; then one probe is let through."""

    failures: int
    window_s: float
    cool_down_s: float


@dataclass(frozen=True)
class LimitSpec:
    """An outbound limit (docs/contract.md#outbound-limits): at most `rate_per_s` requests a second
    with bursts of `burst`, and at most `concurrency` in flight, counted over every worker. None: no
    such bound."""

    rate_per_s: float | None = None
    burst: int = 1
    concurrency: int | None = None
    circuit: Circuit | None = None
    # The longest a 429/503's Retry-After holds the limit's key for everyone.
    max_hold_s: float = MAX_HOLD_S
    # The operator's shared limit this one stands for (its bounds are the operator's).
    shared: str | None = None


@dataclass(frozen=True)
class Schedule:
    """When a workflow runs by itself (docs/contract.md#schedules): a cron expression in a zone, or
    a fixed interval; what a tick does while an earlier one is live; how late a tick may still
    fire; how much to spread fires; the input each tick gets."""

    cron: cron.Cron | None
    every_s: int | None
    timezone: str = "UTC"
    overlap: Overlap = Overlap.SKIP
    catchup_window_s: float = DEFAULT_CATCHUP_WINDOW_S
    jitter_s: float = 0.0
    input: dict[str, Any] = field(default_factory=dict, compare=False)

    def next_after(self, after: datetime) -> datetime | None:
        """The first tick instant strictly after `after`, in UTC (None: never again).

        Intervals are counted from the Unix epoch, so `every_s: 60` ticks on the minute
        and every worker computes the same instants."""
        if self.every_s is not None:
            micros = self.every_s * 1_000_000
            since = (after.astimezone(UTC) - EPOCH) // timedelta(microseconds=1)
            return EPOCH + timedelta(microseconds=(since // micros + 1) * micros)
        assert self.cron is not None
        return self.cron.next_after(after, ZoneInfo(self.timezone))


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Grouping:
    """How a workflow's webhooks are gathered before one execution starts
    (docs/contract.md#debounce-batch): `debounce` (the last event of a quiet `window_s`, at most
    `max_wait_s` after the first, starts it with the count of the others) or `batch` (`max_items`
    events, or what came in `window_s` after the first, start it with `input.events[]`). `key` (a
    template over the event) gives each value its own group; None: one group for the workflow."""

    kind: str  # "debounce" or "batch"
    window_s: float
    key: str | None = None
    max_wait_s: float | None = None  # debounce only
    max_items: int | None = None  # batch only


# A wait step's event fields (docs/contract.md#events); the others need `event`.
EVENT_WAIT_KEYS = frozenset({"event", "key", "from", "lookback_s"})


@dataclass(frozen=True)
class EventWait:
    """What a wait step waits for besides a resume (docs/contract.md#events): the next event
    `name` whose key is `key` (a template rendered when the wait opens), sent through the API
    (`sender` None) or emitted by the verified deliveries of the workflow `sender` names;
    events received up to `lookback_s` before the wait opened count (None: the setting)."""

    name: str
    key: str
    sender: str | None = None
    lookback_s: float | None = None


@dataclass(frozen=True)
class EventEmit:
    """An event each verified delivery of this workflow emits (docs/contract.md#events):
    `name`, with the key `key` rendered from the delivery (`{{ input.… }}`)."""

    name: str
    key: str


@dataclass(frozen=True)
class FormField:
    """One field of an approval form (docs/contract.md#approvals): a string (at most
    `max_length` characters, or one of `choices`, each a value and its title), a number or
    an integer (within `minimum`/`maximum`), or a boolean (a checkbox)."""

    name: str
    type: str  # "string", "number", "integer" or "boolean"
    title: str
    description: str | None = None
    required: bool = False
    max_length: int | None = None
    choices: tuple[tuple[str, str], ...] = ()  # (value, title) of an enum, in order
    minimum: float | None = None
    maximum: float | None = None


@dataclass(frozen=True)
class ApprovalForm:
    """What a wait step asks a person (docs/contract.md#approvals): a titled form of a few
    fields, and the console users (API key names) who may decide it; none: any operator."""

    title: str
    fields: tuple[FormField, ...]
    assignees: tuple[str, ...] = ()
    description: str | None = None


@dataclass(frozen=True)
class Step:
    """One validated node of the workflow graph."""

    id: str
    type: StepType
    depends_on: tuple[str, ...]
    when: dict[str, Any] | None
    request: dict[str, Any] | None
    retry: RetryPolicy
    duration_s: float | None
    until: str | None
    output: Any
    budget_s: float | None = None  # http_request: all attempts together
    # wait steps: how long to wait for a resume, what a timeout does, how resumes prove
    # who sent them ("token": the URL alone; "signature": also Standard Webhooks headers).
    timeout_s: float | None = None
    on_timeout: OnTimeout = OnTimeout.FAIL
    resume_auth: ResumeAuth = ResumeAuth.TOKEN
    # wait steps that ask a person (docs/contract.md#approvals): the form and its assignees.
    form: ApprovalForm | None = None
    # wait steps that also end on an event (docs/contract.md#events); None: resumes only.
    event: EventWait | None = None
    # http_request: the name of the definition's outbound limit it goes through (a
    # template over input renders one key per value).
    limit: str | None = None
    # map (docs/contract.md#map): the template (or array) of items, the steps each item runs (in
    # topological order, ids local to the item), how many items run at once, and what a
    # failed item does to the rest.
    items: Any = None
    body: tuple[Step, ...] = ()
    max_parallel: int = DEFAULT_MAP_PARALLEL
    on_item_failure: ItemFailure = ItemFailure.FAIL_FAST
    # workflow (docs/contract.md#child-workflows): the key of the workflow its child execution runs
    # (the newest version when the step starts), and the child's input (templates; {} by default).
    workflow: str | None = None
    child_input: Any = None

    @property
    def repeat_safe(self) -> bool:
        """Whether running it again after an unknown outcome cannot cause a second effect."""
        return self.request is None or (
            self.request["method"] in SAFE_METHODS or self.request["idempotency_key"] is not None
        )

    def body_step(self, local_id: str) -> Step:
        """A map's item step by its id within the item (KeyError when it has none)."""
        for sub in self.body:
            if sub.id == local_id:
                return sub
        raise KeyError(local_id)

    def body_ancestors(self, local_id: str) -> frozenset[str]:
        """The item steps (ids within the item) whose outputs an item step may read."""
        parents = {sub.id: sub.depends_on for sub in self.body}
        return closure(parents, parents[local_id])


def item_row(map_id: str, index: int, local_id: str) -> str:
    """The step row of one item's step of a map."""
    return f"{map_id}[{index}].{local_id}"


def split_item_row(step_id: str) -> tuple[str, int, str] | None:
    """(map id, item index, step id within the item) of an item's row; None for a step of
    the workflow itself."""
    if "[" not in step_id:
        return None
    match = ITEM_ROW.fullmatch(step_id)
    if match is None:
        return None
    return match.group(1), int(match.group(2)), match.group(3)


@dataclass(frozen=True)
class Definition:
    """A validated workflow whose steps are in topological order."""

    name: str
    webhook_auth: str
    steps: tuple[Step, ...]
    concurrency: Concurrency | None = None
    deadline_s: float | None = None
    start_within_s: float | None = None
    retention_days: float = DEFAULT_RETENTION_DAYS
    # How long accepted webhooks' raw requests are kept for re-ingest (flowforge/store/archive.py);
    # 0, the default, keeps none.
    archive_days: float = 0.0
    schedule: Schedule | None = None
    input_schema: Any = (
        None  # JSON Schema 2020-12 of webhook bodies (flowforge/domain/inputschema.py)
    )
    grouping: Grouping | None = (
        None  # trigger.webhook.debounce or .batch (flowforge/store/grouping.py)
    )
    limits: dict[str, LimitSpec] = field(default_factory=dict, compare=False)
    # docs/contract.md#priority: an integer, or the template "{{ input.<path> }}" (see
    # execution_priority).
    priority: int | str = DEFAULT_PRIORITY
    # docs/contract.md#search-attributes: (name, template) pairs rendered at intake
    # (definitions/attributes.py); () when the version declares none.
    attributes: tuple[tuple[str, str], ...] = ()
    # docs/contract.md#events: the event each verified delivery emits; None: none.
    emits: EventEmit | None = None
    _by_id: dict[str, Step] = field(init=False, compare=False, repr=False)
    _children: dict[str, tuple[str, ...]] = field(init=False, compare=False, repr=False)
    _ancestors: dict[str, frozenset[str]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        parents = {step.id: step.depends_on for step in self.steps}
        children = {
            parent: tuple(step.id for step in self.steps if parent in step.depends_on)
            for parent in parents
        }
        ancestors = {step.id: closure(parents, step.depends_on) for step in self.steps}
        object.__setattr__(self, "_by_id", {step.id: step for step in self.steps})
        object.__setattr__(self, "_children", children)
        object.__setattr__(self, "_ancestors", ancestors)

    def step(self, step_id: str) -> Step:
        """Find a step by id; the engine holds ids, not Step objects, in its rows.

        The row of a map's item (`lines[3].reserve`) gets its step with the row's id and
        its parents named as rows of the same item, so that every part of FlowForge that
        claims, fences, retries or recovers a step treats it as an ordinary one."""
        found = self._by_id.get(step_id)
        if found is not None:
            return found
        parts = split_item_row(step_id)
        if parts is None or parts[0] not in self._by_id:
            raise KeyError(step_id)
        map_id, index, local = parts
        sub = self._by_id[map_id].body_step(local)
        return replace(
            sub,
            id=step_id,
            depends_on=tuple(item_row(map_id, index, parent) for parent in sub.depends_on),
        )

    def children(self, step_id: str) -> tuple[str, ...]:
        """Name the steps that may become ready once this one finishes."""
        return self._children[step_id]

    def ancestors(self, step_id: str) -> frozenset[str]:
        """Name every step whose output this step's templates may read."""
        return self._ancestors[step_id]

    def wait_steps(self) -> tuple[str, ...]:
        """Name the wait steps, whose pending resumes a unit of work must load."""
        return tuple(step.id for step in self.steps if step.type == StepType.WAIT)

    def child_workflows(self) -> tuple[str, ...]:
        """The workflow keys its workflow steps start (docs/contract.md#child-workflows), each once,
        in order."""
        keys = [step.workflow for step in self.steps if step.workflow is not None]
        return tuple(dict.fromkeys(keys))

    def roots(self) -> tuple[str, ...]:
        """Name the steps that start as soon as an execution begins."""
        return tuple(step.id for step in self.steps if not step.depends_on)


def is_step_id(text: str) -> bool:
    """Whether text is a whole step id (a full match: no trailing newline slips through)."""
    return STEP_ID.fullmatch(text) is not None


def is_step_row(text: str) -> bool:
    """Whether text names a step row: a step of the workflow, or one of a map's items'
    (`lines[3].reserve`), which an operator resolves like any other."""
    return is_step_id(text) or split_item_row(text) is not None
