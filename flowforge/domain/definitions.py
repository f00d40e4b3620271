"""Workflow definition parsing and validation: shape, DAG, templates and limits
(docs/contract.md#templates)."""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flowforge.domain import cron, inputschema, templating
from flowforge.domain.jsonvalues import is_number
from flowforge.domain.model import (
    WORKFLOW_KEY,
    OnExhausted,
    OnFull,
    OnTimeout,
    Overlap,
    StepType,
    WebhookAuth,
)
from flowforge.errors import ClientError

MAX_DEFINITION_BYTES = 262_144
MAX_STEPS = 100
MAX_PARENTS = 20
MAX_TEMPLATE_CHARS = 2_048
MAX_NESTING_DEPTH = 20
MAX_STRING_CHARS = 65_536
MAX_NAME_CHARS = 200

STEP_TYPES = tuple(StepType)
# docs/contract.md#map: the step types a map's items may run (no nested map, no wait: a resume URL
# per item is not part of the contract).
ITEM_STEP_TYPES = ("http_request", "delay", "transform")
ON_ITEM_FAILURE = ("fail_fast", "collect")
# The cap on a map's items, refused at publish (a literal array) and at run time (what
# `items` rendered to); and on how many items run at once.
MAX_MAP_ITEMS = 10_000
MAX_MAP_PARALLEL = 1_000
DEFAULT_MAP_PARALLEL = 10
# Names an item's steps read besides their siblings: the item and its position.
ITEM_NAMES = frozenset({"item", "index"})
METHODS = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
OPS = ("exists", "eq", "ne", "gt", "gte", "lt", "lte", "in")
RESERVED_NAMES = frozenset({"input", "execution", "secrets", "waits"})
ON_TIMEOUT = tuple(OnTimeout)
RESUME_AUTH = ("token", "signature")
MAX_WAIT_S = 31_536_000  # a year, like a delay
EXECUTION_FIELDS = ("id", "workflow", "version")

STEP_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# The row of one item's step of a map (docs/contract.md#map): `lines[12].reserve`. Neither '[' nor
# '.' may appear in a step id, so an item's row never collides with a step of the workflow.
ITEM_ROW = re.compile(
    r"([A-Za-z_][A-Za-z0-9_]{0,63})\[([0-9]{1,9})\]\.([A-Za-z_][A-Za-z0-9_]{0,63})"
)
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TOP_KEYS = frozenset(
    {
        "name",
        "input_schema",
        "description",
        "trigger",
        "steps",
        "concurrency",
        "deadline_s",
        "start_within_s",
        "retention_days",
        "limits",
        "archive_days",
        "priority",
    }
)
# docs/contract.md#priority: an execution's priority, a literal or "{{ input.<path> }}" rendered
# when the execution is created; higher is claimed first among ready steps, with ageing
# (flowforge/worker/executor.py). The range keeps the ageing's arithmetic small and
# the column a smallint (sql/0032_priorities.sql).
MIN_PRIORITY = -100
MAX_PRIORITY = 100
DEFAULT_PRIORITY = 0
# docs/contract.md#outbound-limits: outbound limits, by name; a step names one with `limit`.
# Bounds (docs/reference/security.md, "Who owns a limit"): a rate of at least one request
# an hour (1e-9/s spaced requests 31 years apart), a burst and a concurrency up to
# MAX_LIMIT_RATE, and a Retry-After hold of at most MAX_HOLD_S (a limit may lower it
# with max_hold_s; 0: a Retry-After never holds the key).
_LIMIT_KEYS = frozenset({"rate_per_s", "burst", "concurrency", "circuit", "max_hold_s"})
_CIRCUIT_KEYS = frozenset({"failures", "window_s", "cool_down_s"})
MAX_CIRCUIT_S = 86_400
MAX_LIMITS = 100
MAX_LIMIT_RATE = 100_000
MIN_LIMIT_RATE = 1 / 3600
MAX_HOLD_S = 3600.0
# A limit an operator shares between named workflows (FLOWFORGE_SHARED_LIMITS): a
# definition opts in with {"shared": NAME} and no bounds of its own.
SHARED_LIMIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MAX_CIRCUIT_FAILURES = 1000
# `concurrency` (docs/reference/definition.md): its limit and its queue.
MAX_CONCURRENCY_LIMIT = 100_000
MAX_QUEUED = 10**9
# An http_request step's request and retry policy; /openapi.json reads these bounds.
MAX_REQUEST_TIMEOUT_S = 300
DEFAULT_REQUEST_TIMEOUT_S = 30
MAX_ATTEMPTS = 20
MAX_INITIAL_INTERVAL_S = 3600
MIN_BACKOFF_COEFFICIENT = 1
MAX_BACKOFF_COEFFICIENT = 10
MAX_RETRY_INTERVAL_S = 86_400
# A delay's duration_s: a year at most.
MAX_DELAY_S = 31_536_000
_CONCURRENCY_KEYS = frozenset({"limit", "key", "on_full", "max_queued"})
# A definition's on_full choices (the others are a schedule's overlap policies).
ON_FULL = (OnFull.QUEUE, OnFull.DROP_NEW, OnFull.CANCEL_OLDEST)
_SCHEDULE_KEYS = frozenset(
    {"cron", "every_s", "timezone", "overlap", "catchup_window_s", "jitter_s", "input"}
)
OVERLAP = tuple(Overlap)
MAX_EVERY_S = 31_536_000
MAX_CATCHUP_WINDOW_S = 604_800  # a week
MAX_JITTER_S = 3_600
DEFAULT_CATCHUP_WINDOW_S = 60
# Time limits reach a year at most, like a delay.
MAX_TIME_LIMIT_S = 31_536_000
# How long finished executions are kept (docs/contract.md#retention). Fractions are allowed: a test
# or a soak keeps them for minutes. The newest version's value applies to every execution of
# the workflow (flowforge/worker/retention.py reads it from the stored definition).
DEFAULT_RETENTION_DAYS = 30.0
MAX_RETENTION_DAYS = 3650.0
_COMMON_KEYS = frozenset({"id", "type", "depends_on", "when"})
_TYPE_KEYS = {
    "http_request": frozenset({"request", "retry", "budget_s", "limit"}),
    "delay": frozenset({"duration_s", "until"}),
    "transform": frozenset({"output"}),
    "wait": frozenset({"timeout_s", "on_timeout", "auth"}),
    "map": frozenset({"items", "steps", "max_parallel", "on_item_failure"}),
    "workflow": frozenset({"workflow", "input"}),
}
_REQUEST_KEYS = frozenset(
    {
        "method",
        "url",
        "headers",
        "json",
        "body",
        "timeout_s",
        "idempotency_key",
        "allow_templated_destination",
    }
)
# A URL template's origin: up to the first '/', '?' or '#' after its '://' (the whole
# template when it has none, `{{ input.callback_url }}`).
_ORIGIN_END = re.compile(r"://[^/?#]*")
_SECRETS_MESSAGE = "secrets may only be used in http_request requests: outputs are stored"
_WAITS_MESSAGE = (
    "waits may only be used in http_request requests: a resume URL is a credential and"
    " outputs are stored"
)


class PriorityInvalid(ClientError):
    """The priority template rendered to something that is not a priority: the webhook
    is refused and nothing is stored (docs/contract.md#priority)."""

    status = 422
    title = "Priority invalid"


class DefinitionInvalid(ClientError):
    """The workflow definition breaks the rules of docs/contract.md#definition."""

    status = 422
    title = "Invalid definition"
    errors: list[dict[str, str]]

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{error['path']}: {error['message']}" for error in errors))
        self.errors = errors

    @property
    def detail(self) -> str:
        """A count: each problem is in `errors`, with its JSON path."""
        return f"the definition has {len(self.errors)} problem(s)"


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


# retry.on_exhausted's choices.
ON_EXHAUSTED = tuple(OnExhausted)


@dataclass(frozen=True)
class Concurrency:
    """How many executions (of one key value) may hold a slot, and what a full one does."""

    limit: int
    key: str | None = None  # a template over `input`; None: one queue for the workflow
    on_full: OnFull = OnFull.QUEUE
    max_queued: int | None = None


# The concurrency key of a schedule's ticks (docs/contract.md#schedules): no rendered key may take
# it.
SCHEDULE_KEY = "@schedule"
# Keys are stored and shown; a bounded length keeps index entries small.
MAX_KEY_CHARS = 255


class KeyUnrendered(ValueError):
    """A concurrency key template that does not render to a usable key for this input."""


def render_concurrency_key(definition: Definition, input_value: Any) -> str | None:
    """An execution's concurrency key from its input: '' for one queue per workflow, None
    without a limit. Pure, so the engine (a child's admission, docs/contract.md#child-workflows) and
    the intake (flowcontrol.concurrency_key) apply the same rules."""
    concurrency = definition.concurrency
    if concurrency is None:
        return None
    if concurrency.key is None:
        return ""
    try:
        value = templating.render(concurrency.key, {"input": input_value})
    except templating.TemplateError as exc:
        raise KeyUnrendered(f"concurrency key {concurrency.key!r}: {exc}") from None
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if len(text) > MAX_KEY_CHARS or "\x00" in text:
        raise KeyUnrendered(
            f"concurrency key must render to at most {MAX_KEY_CHARS} characters without NUL"
        )
    if text == SCHEDULE_KEY:
        raise KeyUnrendered(f"concurrency key {SCHEDULE_KEY!r} is reserved for schedules")
    return text


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

# docs/contract.md#debounce-batch: debounce and batch bounds. A window is seconds to a day; a
# debounce's max wait a week at most (its group's events are kept until it starts); a batch's size
# bounds the execution input it builds (max_items bodies under the webhook body limit each).
MIN_GROUP_WINDOW_S = 1.0
MAX_GROUP_WINDOW_S = 86_400.0
MAX_DEBOUNCE_WAIT_S = 604_800.0
DEFAULT_MAX_WAIT_WINDOWS = 10  # max_wait_s defaults to ten windows (capped at the maximum)
MAX_BATCH_ITEMS = 1_000
_DEBOUNCE_KEYS = frozenset({"key", "window_s", "max_wait_s"})
_BATCH_KEYS = frozenset({"key", "max_items", "window_s"})


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
    resume_auth: str = "token"
    # http_request: the name of the definition's outbound limit it goes through (a
    # template over input renders one key per value).
    limit: str | None = None
    # map (docs/contract.md#map): the template (or array) of items, the steps each item runs (in
    # topological order, ids local to the item), how many items run at once, and what a
    # failed item does to the rest.
    items: Any = None
    body: tuple[Step, ...] = ()
    max_parallel: int = DEFAULT_MAP_PARALLEL
    on_item_failure: str = "fail_fast"
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
        return _closure(parents, parents[local_id])


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
    _by_id: dict[str, Step] = field(init=False, compare=False, repr=False)
    _children: dict[str, tuple[str, ...]] = field(init=False, compare=False, repr=False)
    _ancestors: dict[str, frozenset[str]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        parents = {step.id: step.depends_on for step in self.steps}
        children = {
            parent: tuple(step.id for step in self.steps if parent in step.depends_on)
            for parent in parents
        }
        ancestors = {step.id: _closure(parents, step.depends_on) for step in self.steps}
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


def parse_definition(doc: Any, *, stored: bool = False) -> Definition:
    """Turn a client's JSON into a Definition, or report every problem in it at once.

    `stored` parses a version that was published already: rules added since it was
    published (such as the range of a literal `until`) must not make it unloadable, so
    they apply to new versions only and are checked again at run time.
    """
    parser = _Parser(stored)
    definition = parser.parse(doc)
    if parser.errors or definition is None:
        raise DefinitionInvalid(parser.errors)
    return definition


def parse_operator_limit(raw: Any, where: str) -> LimitSpec:
    """Check an operator's host or shared limit (FLOWFORGE_OUTBOUND_LIMITS,
    FLOWFORGE_SHARED_LIMITS) against the bounds a definition's limit has."""
    parser = _Parser(stored=False)
    spec = parser.limit_spec(raw, where)
    if parser.errors or spec is None:
        raise DefinitionInvalid(parser.errors)
    return spec


def parse_schedule(raw: Any) -> Schedule:
    """A stored `trigger.schedule` object back as a Schedule (validated when published)."""
    parser = _Parser(stored=True)
    schedule = parser.schedule({"trigger": {"schedule": raw}})
    if parser.errors or schedule is None:
        raise DefinitionInvalid(parser.errors)
    return schedule


def _closure(parents: Mapping[str, Iterable[str]], start: Iterable[str]) -> frozenset[str]:
    """Collect every step reachable through depends_on; tolerates cycles in invalid input."""
    seen: set[str] = set()
    stack = list(start)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(parents.get(node, ()))
    return frozenset(seen)


def _topological(parents: dict[str, list[str]]) -> list[str]:
    """Order parents before children, keeping definition order among steps that are ready."""
    ids = list(parents)
    position = {step_id: index for index, step_id in enumerate(ids)}
    waiting = {step_id: len(deps) for step_id, deps in parents.items()}
    children: dict[str, list[str]] = {step_id: [] for step_id in ids}
    for step_id, deps in parents.items():
        for parent in deps:
            children[parent].append(step_id)
    ready = [position[step_id] for step_id in ids if waiting[step_id] == 0]
    order: list[str] = []
    while ready:
        step_id = ids[heapq.heappop(ready)]
        order.append(step_id)
        for child in children[step_id]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, position[child])
    return order


def _cycles(parents: dict[str, list[str]], ordered: set[str]) -> list[list[str]]:
    """Name each cycle once, so the author sees the loop and not just that one exists."""
    position = {step_id: index for index, step_id in enumerate(parents)}
    walked: set[str] = set()
    cycles: list[list[str]] = []
    for start in parents:
        trail: list[str] = []
        node = start
        # Every step left out of the order has a parent also left out: walking up must loop.
        while node not in ordered and node not in walked and node not in trail:
            trail.append(node)
            node = next(parent for parent in parents[node] if parent not in ordered)
        if node in trail:
            loop = trail[trail.index(node) :]
            first = loop.index(min(loop, key=position.__getitem__))
            cycles.append(loop[first:] + loop[:first])
        walked.update(trail)
    return cycles


def _count_steps(steps: list[Any]) -> int:
    """Steps of the workflow and of its maps' items: both bound the work of each check."""
    inner = sum(
        len(raw["steps"])
        for raw in steps
        if isinstance(raw, dict) and raw.get("type") == "map" and isinstance(raw.get("steps"), list)
    )
    return len(steps) + inner


def _lone_placeholder(text: str) -> bool:
    """Whether text is exactly one `{{ path }}`, with nothing around it."""
    stripped = text.strip()
    return (
        stripped == text
        and stripped.startswith("{{")
        and stripped.endswith("}}")
        and stripped.count("{{") == 1
    )


def execution_priority(definition: Definition, input_value: Any) -> int:
    """The priority a new execution gets (docs/contract.md#priority): the definition's literal, or
    its template rendered against the input. A path the input does not have, or null, is the
    default 0 (a priority is optional for the sender); any other value that is not an
    integer in range raises PriorityInvalid, so the webhook is refused (422) with nothing
    stored — never clamped, which would hide a sender's mistake."""
    template = definition.priority
    if not isinstance(template, str):
        return template
    try:
        value = templating.render(template, {"input": input_value})
    except templating.TemplateError:
        return DEFAULT_PRIORITY
    if value is None:
        return DEFAULT_PRIORITY
    if not _is_whole(value) or not MIN_PRIORITY <= value <= MAX_PRIORITY:
        # The JSON type only: the sender's value is never echoed (problem answers are
        # logged, and shown to whoever sent it; docs/reference/security.md).
        shown = (
            "an integer out of range"
            if _is_whole(value)
            else f"a JSON {templating.json_type(value)}"
        )
        raise PriorityInvalid(
            f"priority {template!r} rendered to {shown}, not an integer from "
            f"{MIN_PRIORITY} to {MAX_PRIORITY}"
        )
    return int(value)


def _is_whole(value: Any) -> bool:
    """Tell JSON integers from booleans and floats."""
    return isinstance(value, int) and not isinstance(value, bool)


class _Parser:
    """Walks one definition, recording every problem with its JSON path."""

    def __init__(self, stored: bool) -> None:
        self.errors: list[dict[str, str]] = []
        self.stored = stored
        self.wait_ids: frozenset[str] = frozenset()
        self.top_ids: frozenset[str] = frozenset()
        self.limit_names: frozenset[str] = frozenset()

    def error(self, path: str, message: str) -> None:
        """Record a problem and carry on, so the author sees them all in one reply."""
        self.errors.append({"path": path, "message": message})

    def parse(self, doc: Any) -> Definition | None:
        """Validate the whole document; return a Definition only when nothing is wrong."""
        if not isinstance(doc, dict):
            self.error("$", "a definition must be a JSON object")
            return None
        # Limits come first and alone: they bound the work of every check after them.
        self.check_limits(doc, "$", 1)
        steps = doc.get("steps")
        if isinstance(steps, list) and _count_steps(steps) > MAX_STEPS:
            self.error(
                "$.steps",
                f"{_count_steps(steps)} steps (a map's item steps included) exceed the limit "
                f"of {MAX_STEPS} steps",
            )
        if self.errors:
            return None
        self.unknown_keys(doc, _TOP_KEYS, "$")
        name: Any = doc.get("name")
        if not isinstance(name, str) or not name.strip():
            self.error("$.name", "name is required: a non-empty string")
        elif len(name) > MAX_NAME_CHARS:
            self.error("$.name", f"name exceeds the limit of {MAX_NAME_CHARS} characters")
        if "description" in doc and not isinstance(doc["description"], str):
            self.error("$.description", "description must be a string")
        auth = self.webhook_auth(doc)
        grouping = self.grouping(doc)
        schedule = self.schedule(doc)
        if not isinstance(steps, list) or not steps:
            self.error("$.steps", "steps is required: a non-empty array")
            return None
        concurrency = self.concurrency(doc)
        deadline_s = self.time_limit(doc, "deadline_s")
        start_within_s = self.time_limit(doc, "start_within_s")
        retention_days = self.retention_days(doc)
        archive_days = self.archive_days(doc)
        priority = self.priority(doc)
        input_schema = doc.get("input_schema")
        if "input_schema" in doc:
            for problem in inputschema.problems(input_schema, "$.input_schema"):
                self.error(problem["path"], problem["message"])
        self.limit_names = (
            frozenset(doc["limits"]) if isinstance(doc.get("limits"), dict) else frozenset()
        )
        limits = self.limits(doc)
        parsed = self.parse_steps(steps)
        if self.errors:
            return None
        return Definition(
            name=name,
            webhook_auth=auth,
            steps=parsed,
            concurrency=concurrency,
            deadline_s=deadline_s,
            start_within_s=start_within_s,
            retention_days=retention_days,
            archive_days=archive_days,
            schedule=schedule,
            input_schema=input_schema,
            grouping=grouping,
            limits=limits,
            priority=priority,
        )

    def limits(self, doc: dict[str, Any]) -> dict[str, LimitSpec]:
        """Check `limits`: named outbound limits, each a rate (with a burst), a concurrency
        or both. A name with placeholders keys the limit per value; like a concurrency key
        it may read input only."""
        raw = doc.get("limits", {})
        path = "$.limits"
        if not isinstance(raw, dict):
            self.error(path, "limits must be an object of named limits")
            return {}
        if len(raw) > MAX_LIMITS:
            self.error(path, f"{len(raw)} limits exceed the limit of {MAX_LIMITS}")
            return {}
        found: dict[str, LimitSpec] = {}
        for name, spec in raw.items():
            where = f"{path}.{name}"
            if not name or name.startswith("host:"):
                self.error(where, "a limit's name is non-empty and does not start with 'host:'")
                continue
            if "{{" in name:
                self.concurrency_key(name, where)
            if isinstance(spec, dict) and "shared" in spec:
                shared = spec["shared"]
                if set(spec) != {"shared"} or "{{" in name:
                    self.error(where, 'a shared limit is {"shared": NAME} alone, not templated')
                elif not isinstance(shared, str) or not SHARED_LIMIT_NAME.fullmatch(shared):
                    self.error(f"{where}.shared", "shared names an operator's shared limit")
                else:
                    found[name] = LimitSpec(shared=shared)
                continue
            checked = self.limit_spec(spec, where)
            if checked is not None:
                found[name] = checked
        return found

    def limit_spec(self, spec: Any, where: str) -> LimitSpec | None:
        """Check one limit's bounds: a rate (with a burst), a concurrency, a circuit, the
        longest hold. The operator's host and shared limits are checked the same way."""
        if not isinstance(spec, dict):
            self.error(where, "a limit is an object with rate_per_s, burst, concurrency")
            return None
        self.unknown_keys(spec, _LIMIT_KEYS, where)
        for name in sorted(_LIMIT_KEYS & {k for k, v in spec.items() if v is None}):
            self.error(f"{where}.{name}", f"{name} is left out, never null")
        rate: Any = spec.get("rate_per_s")
        burst: Any = spec.get("burst")
        concurrency: Any = spec.get("concurrency")
        max_hold: Any = spec.get("max_hold_s", MAX_HOLD_S)
        if rate is not None and self.stored and is_number(rate) and 0 < rate < MIN_LIMIT_RATE:
            rate = MIN_LIMIT_RATE  # published before the bound: it applies at run time
        if rate is not None and (
            not is_number(rate) or not MIN_LIMIT_RATE <= rate <= MAX_LIMIT_RATE
        ):
            self.error(
                f"{where}.rate_per_s",
                f"rate_per_s must be a number from {MIN_LIMIT_RATE:.6f} (one an hour) "
                f"to {MAX_LIMIT_RATE}",
            )
        if burst is not None and (
            rate is None or not _is_whole(burst) or not 1 <= burst <= MAX_LIMIT_RATE
        ):
            self.error(
                f"{where}.burst",
                f"burst needs rate_per_s and is an integer from 1 to {MAX_LIMIT_RATE}",
            )
        if concurrency is not None and (
            not _is_whole(concurrency) or not 1 <= concurrency <= MAX_LIMIT_RATE
        ):
            self.error(
                f"{where}.concurrency",
                f"concurrency must be an integer from 1 to {MAX_LIMIT_RATE}",
            )
        if not is_number(max_hold) or not 0 <= max_hold <= MAX_HOLD_S:
            self.error(
                f"{where}.max_hold_s", f"max_hold_s must be seconds from 0 to {MAX_HOLD_S:g}"
            )
        circuit = self.circuit(spec.get("circuit"), f"{where}.circuit")
        if rate is None and concurrency is None and circuit is None:
            self.error(where, "a limit needs rate_per_s, concurrency or circuit")
            return None
        return LimitSpec(
            rate_per_s=float(rate) if is_number(rate) else None,
            burst=burst if _is_whole(burst) else 1,
            concurrency=concurrency if _is_whole(concurrency) else None,
            circuit=circuit,
            max_hold_s=float(max_hold) if is_number(max_hold) else MAX_HOLD_S,
        )

    def circuit(self, raw: Any, path: str) -> Circuit | None:
        """Check a limit's `circuit`: failures, window_s and cool_down_s, all required."""
        if raw is None:
            return None
        if not isinstance(raw, dict):
            self.error(path, "circuit must be an object with failures, window_s, cool_down_s")
            return None
        self.unknown_keys(raw, _CIRCUIT_KEYS, path)
        failures: Any = raw.get("failures")
        window: Any = raw.get("window_s")
        cool_down: Any = raw.get("cool_down_s")
        good = True
        if not _is_whole(failures) or not 1 <= failures <= MAX_CIRCUIT_FAILURES:
            self.error(
                f"{path}.failures",
                f"failures is required: an integer from 1 to {MAX_CIRCUIT_FAILURES}",
            )
            good = False
        for name, value in (("window_s", window), ("cool_down_s", cool_down)):
            if not is_number(value) or not 0 < value <= MAX_CIRCUIT_S:
                self.error(f"{path}.{name}", f"{name} is required: seconds in (0, {MAX_CIRCUIT_S}]")
                good = False
        return Circuit(failures, float(window), float(cool_down)) if good else None

    def concurrency(self, doc: dict[str, Any]) -> Concurrency | None:
        """Check `concurrency`: a positive limit, a key over input only, a known on_full."""
        if "concurrency" not in doc:
            return None
        raw = doc["concurrency"]
        path = "$.concurrency"
        if not isinstance(raw, dict):
            self.error(path, "concurrency must be an object with limit, key, on_full, max_queued")
            return None
        self.unknown_keys(raw, _CONCURRENCY_KEYS, path)
        limit: Any = raw.get("limit")
        if not _is_whole(limit) or not 1 <= limit <= MAX_CONCURRENCY_LIMIT:
            self.error(
                f"{path}.limit", f"limit is required: an integer from 1 to {MAX_CONCURRENCY_LIMIT}"
            )
        key = raw.get("key")
        if "key" in raw:
            self.concurrency_key(key, f"{path}.key")
        on_full = raw.get("on_full", "queue")
        if on_full not in ON_FULL:
            self.error(f"{path}.on_full", f"on_full must be one of {', '.join(ON_FULL)}")
        max_queued: Any = raw.get("max_queued")
        if "max_queued" in raw and (not _is_whole(max_queued) or not 1 <= max_queued <= MAX_QUEUED):
            self.error(
                f"{path}.max_queued", f"max_queued must be an integer from 1 to {MAX_QUEUED}"
            )
        if not _is_whole(limit) or on_full not in ON_FULL:
            return None
        return Concurrency(
            limit, key if isinstance(key, str) else None, OnFull(on_full), max_queued
        )

    def concurrency_key(self, key: Any, path: str) -> None:
        """A key is rendered at intake from the webhook body alone, and it is stored: it may
        read `input` only — never a secret, and nothing that exists only later."""
        if not isinstance(key, str) or not key:
            self.error(path, "key must be a non-empty template, such as {{ input.customer }}")
            return
        if len(key) > MAX_TEMPLATE_CHARS:
            self.error(path, f"template exceeds the limit of {MAX_TEMPLATE_CHARS} characters")
            return
        try:
            placeholders = templating.find_placeholders(key)
        except templating.TemplateSyntaxError as error:
            self.error(path, str(error))
            return
        for dotted in placeholders:
            head = dotted.split(".")[0]
            if head == "secrets":
                self.error(path, f"{dotted!r}: a concurrency key is stored: no secrets")
            elif head != "input":
                self.error(path, f"{dotted!r}: a concurrency key may read input only")

    def priority(self, doc: dict[str, Any]) -> int | str:
        """Check `priority`: an integer in [MIN_PRIORITY, MAX_PRIORITY], or exactly one
        placeholder over `input` — rendered once, when the execution is created, from the
        webhook's body alone (so never a secret, nor anything that exists only later)."""
        if "priority" not in doc:
            return DEFAULT_PRIORITY
        value = doc["priority"]
        path = "$.priority"
        message = (
            f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, or a "
            "template of one placeholder over input, such as {{ input.priority }}"
        )
        if _is_whole(value):
            if MIN_PRIORITY <= value <= MAX_PRIORITY:
                return int(value)
            self.error(path, message)
            return DEFAULT_PRIORITY
        if not isinstance(value, str) or len(value) > MAX_TEMPLATE_CHARS:
            self.error(path, message)
            return DEFAULT_PRIORITY
        try:
            placeholders = templating.find_placeholders(value)
        except templating.TemplateSyntaxError as error:
            self.error(path, str(error))
            return DEFAULT_PRIORITY
        if len(placeholders) != 1 or not _lone_placeholder(value):
            self.error(path, message)
            return DEFAULT_PRIORITY
        if placeholders[0].split(".")[0] != "input" or "." not in placeholders[0]:
            self.error(
                path, f"{placeholders[0]!r}: a priority reads one value of input, nothing else"
            )
            return DEFAULT_PRIORITY
        return value

    def time_limit(self, doc: dict[str, Any], name: str) -> float | None:
        """Check a whole-execution time limit in seconds."""
        if name not in doc:
            return None
        value = doc[name]
        if not is_number(value) or not 0 < value <= MAX_TIME_LIMIT_S:
            self.error(f"$.{name}", f"{name} must be seconds in (0, {MAX_TIME_LIMIT_S}]")
            return None
        return float(value)

    def retention_days(self, doc: dict[str, Any]) -> float:
        """Check `retention_days`: how long finished executions are kept, in days."""
        if "retention_days" not in doc:
            return DEFAULT_RETENTION_DAYS
        value = doc["retention_days"]
        if not is_number(value) or not 0 < value <= MAX_RETENTION_DAYS:
            self.error(
                "$.retention_days",
                f"retention_days must be days in (0, {MAX_RETENTION_DAYS:.0f}], fractions allowed",
            )
            return DEFAULT_RETENTION_DAYS
        return float(value)

    def archive_days(self, doc: dict[str, Any]) -> float:
        """Check `archive_days`: how long accepted webhooks' raw requests are kept for
        re-ingest, in days; 0 (the default) archives nothing, so no body is stored that
        nobody asked to keep."""
        value = doc.get("archive_days", 0)
        if not is_number(value) or not 0 <= value <= MAX_RETENTION_DAYS:
            self.error(
                "$.archive_days",
                f"archive_days must be days in [0, {MAX_RETENTION_DAYS:.0f}] (0: no archive), "
                "fractions allowed",
            )
            return 0.0
        return float(value)

    def unknown_keys(self, value: dict[str, Any], allowed: Iterable[str], path: str) -> None:
        """Report keys the format does not know, in document order: usually a typo."""
        names = sorted(allowed)
        for key in value:
            if key not in names:
                self.error(f"{path}.{key}", f"unknown key {key!r}; allowed: {', '.join(names)}")

    def check_limits(self, value: Any, path: str, depth: int) -> None:
        """Enforce nesting depth and string length over the whole document."""
        if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
            self.error(path, f"string exceeds the limit of {MAX_STRING_CHARS} characters")
        if not isinstance(value, dict | list):
            return
        if depth > MAX_NESTING_DEPTH:
            self.error(path, f"nesting exceeds the limit of depth {MAX_NESTING_DEPTH}")
            return
        if isinstance(value, dict):
            if any(len(key) > MAX_STRING_CHARS for key in value):
                self.error(path, f"a key exceeds the limit of {MAX_STRING_CHARS} characters")
            children = [(f"{path}.{key}", item) for key, item in value.items()]
        else:
            children = [(f"{path}[{index}]", item) for index, item in enumerate(value)]
        for where, item in children:
            self.check_limits(item, where, depth + 1)

    def webhook_auth(self, doc: dict[str, Any]) -> str:
        """Read how webhooks authenticate; signatures unless the author opts out."""
        if "trigger" not in doc:
            return "signature"
        trigger = doc["trigger"]
        if not isinstance(trigger, dict) or not (
            isinstance(trigger.get("webhook"), dict) or "schedule" in trigger
        ):
            self.error(
                "$.trigger",
                'trigger must be {"webhook": {"auth": "signature"|"none"}, "schedule": {...}}'
                " with either or both",
            )
            return "signature"
        self.unknown_keys(trigger, {"webhook", "schedule"}, "$.trigger")
        if "webhook" not in trigger:
            return "signature"
        webhook = trigger["webhook"]
        if not isinstance(webhook, dict):
            self.error(
                "$.trigger.webhook", 'webhook must be an object such as {"auth": "signature"}'
            )
            return "signature"
        self.unknown_keys(webhook, {"auth", "debounce", "batch"}, "$.trigger.webhook")
        auth = webhook.get("auth", "signature")
        if not isinstance(auth, str) or auth not in set(WebhookAuth):
            self.error(
                "$.trigger.webhook.auth",
                f"auth must be one of {', '.join(sorted(WebhookAuth))}",
            )
            return "signature"
        return str(auth)

    def grouping(self, doc: dict[str, Any]) -> Grouping | None:
        """Check `trigger.webhook.debounce` / `.batch` (docs/contract.md#debounce-batch): one of
        them at most, a key template over input only, windows of
        MIN_GROUP_WINDOW_S..MAX_GROUP_WINDOW_S, a max wait from the window to MAX_DEBOUNCE_WAIT_S,
        1..MAX_BATCH_ITEMS items."""
        trigger = doc.get("trigger")
        webhook = trigger.get("webhook") if isinstance(trigger, dict) else None
        if not isinstance(webhook, dict):
            return None
        kinds = [kind for kind in ("debounce", "batch") if kind in webhook]
        if not kinds:
            return None
        if len(kinds) == 2:
            self.error(
                "$.trigger.webhook.batch", "debounce and batch exclude each other: choose one"
            )
            return None
        kind = kinds[0]
        path = f"$.trigger.webhook.{kind}"
        raw = webhook[kind]
        allowed = _DEBOUNCE_KEYS if kind == "debounce" else _BATCH_KEYS
        if not isinstance(raw, dict):
            self.error(path, f"{kind} must be an object with {', '.join(sorted(allowed))}")
            return None
        before = len(self.errors)
        self.unknown_keys(raw, allowed, path)
        key = raw.get("key")
        if "key" in raw:
            self.concurrency_key(key, f"{path}.key")
        window: Any = raw.get("window_s")
        if not is_number(window) or not MIN_GROUP_WINDOW_S <= window <= MAX_GROUP_WINDOW_S:
            self.error(
                f"{path}.window_s",
                f"window_s is required: seconds in [{MIN_GROUP_WINDOW_S:.0f}, "
                f"{MAX_GROUP_WINDOW_S:.0f}]",
            )
        if kind == "debounce":
            max_wait: Any = raw.get("max_wait_s")
            if "max_wait_s" in raw and not (
                is_number(max_wait)
                and is_number(window)
                and window <= max_wait <= MAX_DEBOUNCE_WAIT_S
            ):
                self.error(
                    f"{path}.max_wait_s",
                    f"max_wait_s must be seconds from window_s to {MAX_DEBOUNCE_WAIT_S:.0f}",
                )
            if len(self.errors) > before:
                return None
            if max_wait is None:
                max_wait = min(MAX_DEBOUNCE_WAIT_S, DEFAULT_MAX_WAIT_WINDOWS * window)
            return Grouping(kind, float(window), key, max_wait_s=float(max_wait))
        items: Any = raw.get("max_items")
        if not _is_whole(items) or not 1 <= items <= MAX_BATCH_ITEMS:
            self.error(
                f"{path}.max_items",
                f"max_items is required: an integer from 1 to {MAX_BATCH_ITEMS}",
            )
        if len(self.errors) > before:
            return None
        return Grouping(kind, float(window), key, max_items=int(items))

    def schedule(self, doc: dict[str, Any]) -> Schedule | None:
        """Check `trigger.schedule` (docs/contract.md#schedules): exactly one of cron and every_s, a
        zone the system's tz database knows, a known overlap policy, bounded windows, object
        input."""
        trigger = doc.get("trigger")
        if not isinstance(trigger, dict) or "schedule" not in trigger:
            return None
        raw = trigger["schedule"]
        path = "$.trigger.schedule"
        if not isinstance(raw, dict):
            self.error(path, "schedule must be an object with cron or every_s")
            return None
        before = len(self.errors)
        self.unknown_keys(raw, _SCHEDULE_KEYS, path)
        expression: cron.Cron | None = None
        every_s: Any = raw.get("every_s")
        if ("cron" in raw) == ("every_s" in raw):
            self.error(path, "a schedule needs exactly one of cron and every_s")
        elif "cron" in raw:
            if not isinstance(raw["cron"], str):
                self.error(f"{path}.cron", "cron must be a string of five fields")
            else:
                try:
                    expression = cron.parse(raw["cron"])
                except cron.CronError as exc:
                    self.error(f"{path}.cron", str(exc))
        elif not _is_whole(every_s) or not 1 <= every_s <= MAX_EVERY_S:
            self.error(f"{path}.every_s", f"every_s must be whole seconds from 1 to {MAX_EVERY_S}")
        zone: Any = raw.get("timezone", "UTC")
        if not _is_zone(zone):
            self.error(f"{path}.timezone", "timezone must be an IANA name such as Europe/Lisbon")
        overlap = raw.get("overlap", "skip")
        if overlap not in OVERLAP:
            self.error(f"{path}.overlap", f"overlap must be one of {', '.join(OVERLAP)}")
        window: Any = raw.get("catchup_window_s", DEFAULT_CATCHUP_WINDOW_S)
        if not is_number(window) or not 1 <= window <= MAX_CATCHUP_WINDOW_S:
            self.error(
                f"{path}.catchup_window_s",
                f"catchup_window_s must be seconds from 1 to {MAX_CATCHUP_WINDOW_S}",
            )
        jitter: Any = raw.get("jitter_s", 0)
        if not is_number(jitter) or not 0 <= jitter <= MAX_JITTER_S:
            self.error(f"{path}.jitter_s", f"jitter_s must be seconds from 0 to {MAX_JITTER_S}")
        given: Any = raw.get("input", {})
        if not isinstance(given, dict):
            self.error(f"{path}.input", "input must be a JSON object (scheduled_at is added)")
        if len(self.errors) > before:
            return None
        return Schedule(
            cron=expression,
            every_s=every_s if expression is None else None,
            timezone=zone,
            overlap=Overlap(overlap),
            catchup_window_s=float(window),
            jitter_s=float(jitter),
            input=given,
        )

    def parse_steps(
        self, steps: list[Any], base: str = "$.steps", outer: frozenset[str] | None = None
    ) -> tuple[Step, ...]:
        """Check every step and the graph they form; return them in topological order.

        `outer` is given for a map's item steps (docs/contract.md#map): what they may read besides
        their siblings — the map's own ancestors, and the item and its index."""
        first_at: dict[str, int] = {}
        for index, raw in enumerate(steps):
            if isinstance(raw, dict) and isinstance(raw.get("id"), str):
                first_at.setdefault(raw["id"], index)
        parents: dict[str, list[str]] = {step_id: [] for step_id in first_at}
        if outer is None:
            # {{ waits.<id>.url }} may name any wait step of the workflow, not only ancestors.
            self.wait_ids = frozenset(
                raw["id"]
                for raw in steps
                if isinstance(raw, dict)
                and raw.get("type") == "wait"
                and isinstance(raw.get("id"), str)
            )
            self.top_ids = frozenset(first_at)
        edges: list[list[str]] = []
        for index, raw in enumerate(steps):
            if not isinstance(raw, dict):
                self.error(f"{base}[{index}]", "a step must be an object")
                edges.append([])
                continue
            edges.append(self.depends_on(raw, f"{base}[{index}]", first_at))
            if self.step_id(raw, index, first_at, base, item=outer is not None):
                parents[raw["id"]] = edges[index]
        ordered = _topological(parents)
        for loop in _cycles(parents, set(ordered)):
            self.error(
                f"{base}[{first_at[loop[0]]}].depends_on",
                "cycle: " + " -> ".join([*loop, loop[0]]),
            )
        parsed: dict[str, Step] = {}
        for index, raw in enumerate(steps):
            if isinstance(raw, dict):
                ancestors = _closure(parents, edges[index])
                if outer is not None:
                    ancestors |= outer
                step = self.parse_step(raw, f"{base}[{index}]", ancestors, item=outer is not None)
                if step is not None:
                    parsed[step.id] = step
        return tuple(parsed[step_id] for step_id in ordered if step_id in parsed)

    def step_id(
        self, raw: dict[str, Any], index: int, first_at: dict[str, int], base: str, *, item: bool
    ) -> bool:
        """Check a step's id; a duplicate is reported where it repeats. An item step's id
        may not shadow a name its templates read: item, index or a step of the workflow."""
        step_id = raw.get("id")
        path = f"{base}[{index}].id"
        if not isinstance(step_id, str) or not STEP_ID.fullmatch(step_id):
            self.error(path, "id is required: a letter or '_' then up to 63 letters, digits or '_'")
        elif step_id in RESERVED_NAMES or (item and step_id in ITEM_NAMES):
            self.error(path, f"{step_id!r} is reserved for the template context")
        elif item and step_id in self.top_ids:
            self.error(path, f"{step_id!r} is also a step of the workflow: give it another id")
        elif first_at[step_id] != index:
            self.error(
                path, f"duplicate step id {step_id!r} (first at {base}[{first_at[step_id]}])"
            )
        else:
            return True
        return False

    def depends_on(self, raw: dict[str, Any], path: str, first_at: dict[str, int]) -> list[str]:
        """Check a step's parents and return the valid ones as graph edges."""
        if "depends_on" not in raw:
            return []
        deps = raw["depends_on"]
        path = f"{path}.depends_on"
        if not isinstance(deps, list):
            self.error(path, "depends_on must be an array of step ids")
            return []
        if len(deps) > MAX_PARENTS:
            self.error(path, f"{len(deps)} parents exceed the limit of {MAX_PARENTS} per step")
        edges: list[str] = []
        for index, dep in enumerate(deps):
            where = f"{path}[{index}]"
            if not isinstance(dep, str) or dep not in first_at:
                self.error(where, f"{dep!r} is not the id of a step in this workflow")
            elif dep == raw.get("id"):
                self.error(where, "a step cannot depend on itself")
            elif dep in edges:
                self.error(where, f"{dep!r} is listed twice")
            else:
                edges.append(dep)
        return edges

    def parse_step(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str], *, item: bool = False
    ) -> Step | None:
        """Check one step's type-specific fields, its condition and its templates."""
        step_type = raw.get("type")
        when = self.when(raw, path, ancestors)
        if item and step_type == "map":
            self.error(f"{path}.type", "a map cannot run inside a map's items")
            return None
        if item and step_type == "wait":
            self.error(f"{path}.type", "a wait step cannot run inside a map's items")
            return None
        allowed = ITEM_STEP_TYPES if item else STEP_TYPES
        if step_type not in allowed:
            self.error(f"{path}.type", f"type must be one of {', '.join(allowed)}")
            return None
        step_type = str(step_type)
        self.unknown_keys(raw, _COMMON_KEYS | _TYPE_KEYS[step_type], path)
        request, retry = None, RetryPolicy(max_attempts=1)
        duration_s, until, output, budget_s = None, None, None, None
        timeout_s, on_timeout, resume_auth = None, OnTimeout.FAIL, "token"
        limit: Any = None
        mapped: dict[str, Any] = {}
        if step_type == StepType.MAP:
            mapped = self.map(raw, path, ancestors)
        elif step_type == StepType.WORKFLOW:
            mapped = self.child(raw, path, ancestors)
        elif step_type == StepType.WAIT:
            timeout_s, on_timeout, resume_auth = self.wait(raw, path)
        elif step_type == StepType.HTTP_REQUEST:
            request = self.request(raw.get("request"), f"{path}.request", ancestors)
            retry = self.retry(raw.get("retry", {}), f"{path}.retry")
            budget_s = self.budget(raw, path, request)
            limit = raw.get("limit")
            if limit is not None and limit not in self.limit_names:
                self.error(f"{path}.limit", "limit must name one of the definition's limits")
        elif step_type == StepType.DELAY:
            duration_s, until = self.delay(raw, path, ancestors)
        elif "output" not in raw:
            self.error(f"{path}.output", "output is required")
        else:
            output = raw["output"]
            self.templates(output, f"{path}.output", ancestors, secrets=False)
        # Built even when errors were recorded, so only well-typed parts may be used here:
        # an id or depends_on of the wrong JSON type must end as a 422, not a TypeError.
        step_id, depends_on = raw.get("id"), raw.get("depends_on")
        return Step(
            id=step_id if isinstance(step_id, str) else "",
            type=StepType(step_type),
            depends_on=tuple(depends_on) if isinstance(depends_on, list) else (),
            when=when,
            request=request,
            retry=retry,
            duration_s=duration_s,
            until=until,
            output=output,
            budget_s=budget_s,
            timeout_s=timeout_s,
            on_timeout=on_timeout,
            resume_auth=resume_auth,
            limit=limit if isinstance(limit, str) else None,
            **mapped,
        )

    def child(self, raw: dict[str, Any], path: str, ancestors: frozenset[str]) -> dict[str, Any]:
        """Check a workflow step (docs/contract.md#child-workflows): the key of the workflow it
        starts, and the child's input (templates over what the step may read, no secrets: it is
        stored)."""
        key = raw.get("workflow")
        if not isinstance(key, str) or not WORKFLOW_KEY.fullmatch(key):
            self.error(
                f"{path}.workflow",
                "workflow is required: the key of the workflow to start (lowercase letters,"
                " digits, '_' and '-', at most 64)",
            )
            key = None
        child_input = raw.get("input", {})
        self.templates(child_input, f"{path}.input", ancestors, secrets=False)
        return {"workflow": key, "child_input": child_input}

    def map(self, raw: dict[str, Any], path: str, ancestors: frozenset[str]) -> dict[str, Any]:
        """Check a map step (docs/contract.md#map): `items` an array or a template that renders one
        (at most MAX_MAP_ITEMS), the steps each item runs, max_parallel, on_item_failure."""
        if "items" not in raw:
            self.error(
                f"{path}.items",
                "items is required: an array, or a template such as "
                "{{ input.order.lines }} that renders one",
            )
        items = raw.get("items")
        if isinstance(items, list):
            if len(items) > MAX_MAP_ITEMS:
                self.error(
                    f"{path}.items",
                    f"{len(items)} items exceed the cap of {MAX_MAP_ITEMS} items per map",
                )
            else:
                self.templates(items, f"{path}.items", ancestors, secrets=False)
        elif isinstance(items, str):
            if "{{" not in items:
                self.error(f"{path}.items", "items must be an array or a template")
            else:
                self.templates(items, f"{path}.items", ancestors, secrets=False)
        elif "items" in raw:
            self.error(f"{path}.items", "items must be an array or a template")
        parallel: Any = raw.get("max_parallel", DEFAULT_MAP_PARALLEL)
        if not _is_whole(parallel) or not 1 <= parallel <= MAX_MAP_PARALLEL:
            self.error(
                f"{path}.max_parallel",
                f"max_parallel must be an integer from 1 to {MAX_MAP_PARALLEL}",
            )
            parallel = DEFAULT_MAP_PARALLEL
        policy: Any = raw.get("on_item_failure", "fail_fast")
        if policy not in ON_ITEM_FAILURE:
            self.error(
                f"{path}.on_item_failure", 'on_item_failure must be "fail_fast" or "collect"'
            )
            policy = "fail_fast"
        steps = raw.get("steps")
        body: tuple[Step, ...] = ()
        if not isinstance(steps, list) or not steps:
            self.error(
                f"{path}.steps", "steps is required: a non-empty array of the steps each item runs"
            )
        else:
            body = self.parse_steps(steps, f"{path}.steps", ancestors | ITEM_NAMES)
        return {
            "items": items,
            "body": body,
            "max_parallel": parallel,
            "on_item_failure": policy,
        }

    def budget(
        self, raw: dict[str, Any], path: str, request: dict[str, Any] | None
    ) -> float | None:
        """Check `budget_s`: room for at least one whole attempt."""
        if "budget_s" not in raw:
            return None
        budget = raw["budget_s"]
        if not is_number(budget) or not 0 < budget <= MAX_TIME_LIMIT_S:
            self.error(f"{path}.budget_s", f"budget_s must be a number in (0, {MAX_TIME_LIMIT_S}]")
            return None
        timeout = request["timeout_s"] if request is not None else None
        if is_number(timeout) and budget < timeout:
            self.error(
                f"{path}.budget_s",
                f"budget_s {budget} is shorter than one attempt's timeout_s {timeout}",
            )
        return float(budget)

    def when(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> dict[str, Any] | None:
        """Check a step's condition, which reads context paths without braces."""
        if "when" not in raw:
            return None
        when = raw["when"]
        path = f"{path}.when"
        if not isinstance(when, dict):
            self.error(path, "when must be an object with path, op and value")
            return None
        self.unknown_keys(when, {"path", "op", "value"}, path)
        target = when.get("path")
        if not isinstance(target, str) or not templating.is_path(target):
            self.error(f"{path}.path", "path is required: a dotted path such as shape.total")
        else:
            self.reference(target, f"{path}.path", ancestors, secrets=False)
        op = when.get("op")
        if op not in OPS:
            self.error(f"{path}.op", f"op must be one of {', '.join(OPS)}")
        elif op != "exists" and "value" not in when:
            self.error(f"{path}.value", f"value is required for op {op!r}")
        elif op == "in" and not isinstance(when["value"], list):
            self.error(f"{path}.value", "value must be an array for op 'in'")
        elif op in ("gt", "gte", "lt", "lte") and not (
            is_number(when["value"]) or isinstance(when["value"], str)
        ):
            self.error(f"{path}.value", f"value must be a number or a string for op {op!r}")
        return when

    def request(self, request: Any, path: str, ancestors: frozenset[str]) -> dict[str, Any] | None:
        """Check and normalise an HTTP request; the only place secrets may appear."""
        if not isinstance(request, dict):
            self.error(path, "request is required: an object with method and url")
            return None
        self.unknown_keys(request, _REQUEST_KEYS, path)
        method = request.get("method", "GET")
        if not isinstance(method, str) or method.upper() not in METHODS:
            self.error(f"{path}.method", f"method must be one of {', '.join(METHODS)}")
        if not isinstance(request.get("url"), str):
            self.error(f"{path}.url", "url is required: a string")
        headers = request.get("headers", {})
        if not isinstance(headers, dict):
            self.error(f"{path}.headers", "headers must be an object of strings")
        else:
            for name, value in headers.items():
                self.header(name, value, f"{path}.headers.{name}")
        if "json" in request and "body" in request:
            self.error(path, "give at most one of json and body")
        if "body" in request and not isinstance(request["body"], str):
            self.error(f"{path}.body", "body must be a string (use json for JSON payloads)")
        timeout_s = request.get("timeout_s", DEFAULT_REQUEST_TIMEOUT_S)
        if not is_number(timeout_s) or not 0 < timeout_s <= MAX_REQUEST_TIMEOUT_S:
            self.error(
                f"{path}.timeout_s",
                f"timeout_s must be a number with 0 < timeout_s <= {MAX_REQUEST_TIMEOUT_S}",
            )
        key = request.get("idempotency_key")
        if "idempotency_key" in request and (not isinstance(key, str) or not key):
            self.error(f"{path}.idempotency_key", "idempotency_key must be a non-empty string")
        self.templates(request, path, ancestors, secrets=True)
        self.destination(request, path)
        normalised = {
            "method": str(method).upper(),
            "url": request.get("url"),
            "headers": headers,
            "timeout_s": timeout_s,
            "idempotency_key": key,
        }
        if request.get("allow_templated_destination") is True:
            normalised["allow_templated_destination"] = True
        normalised.update({k: request[k] for k in ("json", "body") if k in request})
        return normalised

    def destination(self, request: dict[str, Any], path: str) -> None:
        """docs/contract.md#secret-destinations: a request that carries a secret or a resume URL
        goes where the publisher said. Its scheme, host and port may come from a secret (the
        operator's) but not from the execution's data — the input, a step's output — which whoever
        sends the webhook controls, unless `allow_templated_destination` says so."""
        url, opt_in = request.get("url"), request.get("allow_templated_destination", False)
        if not isinstance(opt_in, bool):
            self.error(f"{path}.allow_templated_destination", "must be true or false")
            return
        if not isinstance(url, str) or opt_in:
            return
        end = _ORIGIN_END.search(url)
        origin = url[: end.end()] if end else url
        try:
            carried = {
                placeholder
                for _, text in templating.iter_template_strings(request)
                for placeholder in templating.find_placeholders(text)
                if placeholder.startswith(("secrets.", "waits."))
            }
            chosen = [
                placeholder
                for placeholder in templating.find_placeholders(origin)
                if not placeholder.startswith("secrets.")
            ]
        except templating.TemplateSyntaxError:
            return  # self.templates has said what is wrong with it
        if not carried:
            return
        if chosen:
            self.error(
                f"{path}.url",
                f"this request carries {', '.join(sorted(carried))}, so its scheme, host "
                f"and port must not come from {{{{ {chosen[0]} }}}}: whoever sends the data "
                "would choose where the secret goes. Fix the destination in the definition, "
                "or set allow_templated_destination: true to accept that",
            )

    def header(self, name: str, value: Any, path: str) -> None:
        """Keep header names to RFC 7230 tokens and values free of line breaks."""
        if not _HEADER_NAME.fullmatch(name):
            self.error(path, f"header name {name!r} is not an RFC 7230 token")
        if not isinstance(value, str):
            self.error(path, "header value must be a string")
        elif "\r" in value or "\n" in value:
            self.error(path, "header value must not contain CR or LF")

    def retry(self, retry: Any, path: str) -> RetryPolicy:
        """Check a retry policy, whose bounds keep back-off finite and sane."""
        if not isinstance(retry, dict):
            self.error(path, "retry must be an object")
            return RetryPolicy()
        default = RetryPolicy()
        self.unknown_keys(retry, set(RetryPolicy.__dataclass_fields__), path)
        attempts = retry.get("max_attempts", default.max_attempts)
        if not _is_whole(attempts) or not 1 <= attempts <= MAX_ATTEMPTS:
            self.error(
                f"{path}.max_attempts", f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS}"
            )
        initial = retry.get("initial_interval_s", default.initial_interval_s)
        if not is_number(initial) or not 0 < initial <= MAX_INITIAL_INTERVAL_S:
            self.error(
                f"{path}.initial_interval_s",
                f"initial_interval_s must be in (0, {MAX_INITIAL_INTERVAL_S}]",
            )
        coefficient = retry.get("backoff_coefficient", default.backoff_coefficient)
        if (
            not is_number(coefficient)
            or not MIN_BACKOFF_COEFFICIENT <= coefficient <= MAX_BACKOFF_COEFFICIENT
        ):
            self.error(
                f"{path}.backoff_coefficient",
                f"backoff_coefficient must be in [{MIN_BACKOFF_COEFFICIENT}, "
                f"{MAX_BACKOFF_COEFFICIENT}]",
            )
        maximum = retry.get("max_interval_s", default.max_interval_s)
        if not is_number(maximum) or not maximum <= MAX_RETRY_INTERVAL_S:
            self.error(
                f"{path}.max_interval_s",
                f"max_interval_s must be a number up to {MAX_RETRY_INTERVAL_S}",
            )
        elif is_number(initial) and maximum < initial:
            self.error(f"{path}.max_interval_s", "max_interval_s must be >= initial_interval_s")
        on_exhausted = retry.get("on_exhausted", default.on_exhausted)
        if on_exhausted not in ON_EXHAUSTED:
            self.error(f"{path}.on_exhausted", 'on_exhausted must be "fail" or "pause"')
            on_exhausted = default.on_exhausted
        return RetryPolicy(attempts, initial, coefficient, maximum, OnExhausted(on_exhausted))

    def delay(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> tuple[float | None, str | None]:
        """Check that a delay names exactly one way to wait."""
        duration_s: Any = raw.get("duration_s")
        until: Any = raw.get("until")
        if ("duration_s" in raw) == ("until" in raw):
            self.error(path, "a delay needs exactly one of duration_s and until")
        elif "duration_s" in raw:
            if not is_number(duration_s) or not 0 <= duration_s <= MAX_DELAY_S:
                self.error(
                    f"{path}.duration_s",
                    f"duration_s must be a number from 0 to {MAX_DELAY_S} (a year)",
                )
        elif not isinstance(until, str):
            self.error(f"{path}.until", "until must be an ISO-8601 timestamp or a template")
        elif "{{" in until or "}}" in until:
            self.templates(until, f"{path}.until", ancestors, secrets=False)
        elif not _is_aware_timestamp(until):
            self.error(f"{path}.until", "until must be an ISO-8601 timestamp with a timezone")
        elif not self.stored:
            try:
                parse_until(until)
            except ValueError as exc:
                self.error(f"{path}.until", str(exc))
        return duration_s, until

    def wait(self, raw: dict[str, Any], path: str) -> tuple[float | None, OnTimeout, str]:
        """Check a wait step: a bounded timeout, what the timeout does, how resumes prove
        themselves."""
        timeout_s: Any = raw.get("timeout_s")
        if not is_number(timeout_s) or not 0 < timeout_s <= MAX_WAIT_S:
            self.error(
                f"{path}.timeout_s",
                f"timeout_s is required: a number of seconds with 0 < timeout_s <= {MAX_WAIT_S}",
            )
            timeout_s = None
        on_timeout: Any = raw.get("on_timeout", "fail")
        if on_timeout not in ON_TIMEOUT:
            self.error(f"{path}.on_timeout", 'on_timeout must be "fail" or "continue"')
            on_timeout = OnTimeout.FAIL
        auth: Any = raw.get("auth", "token")
        if auth not in RESUME_AUTH:
            self.error(
                f"{path}.auth",
                'auth must be "token" (the resume URL alone) or "signature" (also signed'
                " with the workflow's webhook secret)",
            )
            auth = "token"
        return timeout_s, OnTimeout(on_timeout), auth

    def templates(self, value: Any, path: str, ancestors: frozenset[str], *, secrets: bool) -> None:
        """Check the syntax and the scope of every template string under a value."""
        for where, text in templating.iter_template_strings(value, path):
            if len(text) > MAX_TEMPLATE_CHARS:
                self.error(where, f"template exceeds the limit of {MAX_TEMPLATE_CHARS} characters")
                continue
            try:
                placeholders = templating.find_placeholders(text)
            except templating.TemplateSyntaxError as error:
                self.error(where, str(error))
                continue
            for placeholder in placeholders:
                self.reference(placeholder, where, ancestors, secrets=secrets)

    def reference(
        self, dotted: str, path: str, ancestors: frozenset[str], *, secrets: bool
    ) -> None:
        """Check that a path reads something that will exist when the step runs."""
        head, *rest = dotted.split(".")
        if head == "secrets":
            if not secrets:
                self.error(path, _SECRETS_MESSAGE)
            elif len(rest) != 1:
                self.error(path, f"{dotted!r}: name one secret, as secrets.NAME")
            elif not self.stored and rest[0].upper().endswith("_WORKFLOWS"):
                # FLOWFORGE_SECRET_<NAME>_WORKFLOWS binds secret NAME to workflows. A rule
                # newer than some stored versions: those must still load (and run).
                self.error(path, f"{dotted!r}: secret names may not end in _workflows")
        elif head == "waits":
            if not secrets:
                self.error(path, _WAITS_MESSAGE)
            elif len(rest) != 2 or rest[1] != "url":
                self.error(path, f"{dotted!r}: a resume URL is named as waits.STEP.url")
            elif rest[0] not in self.wait_ids:
                self.error(path, f"{dotted!r}: {rest[0]!r} is not a wait step of this workflow")
        elif head == "execution":
            if len(rest) != 1 or rest[0] not in EXECUTION_FIELDS:
                self.error(path, f"{dotted!r}: execution has only {', '.join(EXECUTION_FIELDS)}")
        elif head != "input" and head not in ancestors:
            self.error(
                path,
                f"{dotted!r}: {head!r} is not input, execution, secrets"
                " or a step this one depends on (directly or through its parents)",
            )


# Instants every part of FlowForge can store and load again. PostgreSQL holds timestamps
# up to the year 294276, Python's datetime only years 1 to 9999 — in whatever time zone a
# session reads them, so a day of margin at each end.
EARLIEST_INSTANT = datetime(1, 1, 2, tzinfo=UTC)
LATEST_INSTANT = datetime(9999, 12, 30, tzinfo=UTC)


def _is_zone(name: Any) -> bool:
    """Whether name is a zone the system's tz database knows (no paths, no empty names)."""
    if not isinstance(name, str) or not 0 < len(name) <= 64 or "\x00" in name:
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


def _is_aware_timestamp(text: str) -> bool:
    """Accept only instants: a timestamp without a timezone means a different time per host."""
    try:
        return datetime.fromisoformat(text).tzinfo is not None
    except ValueError:
        return False


def parse_until(text: str) -> datetime:
    """A delay's `until` as an aware instant FlowForge can store; ValueError saying why not."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"until {text!r} is not an ISO-8601 timestamp (years 0001 to 9999)"
        ) from None
    if moment.tzinfo is None:
        raise ValueError(f"until {text!r} has no timezone")
    try:
        in_utc = moment.astimezone(UTC)
    except OverflowError:
        in_utc = None
    if in_utc is None or not EARLIEST_INSTANT <= in_utc <= LATEST_INSTANT:
        raise ValueError(
            f"until {text!r} is outside the instants FlowForge can store: it must be "
            f"between {EARLIEST_INSTANT.date()} and {LATEST_INSTANT.date()} (UTC)"
        )
    return moment
