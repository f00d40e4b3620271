"""Workflow definition parsing and validation: shape, DAG, templates and limits (SPEC section 5)."""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flowforge import cron, inputschema, templating
from flowforge.errors import ClientError
from flowforge.jsonvalues import is_number
from flowforge.model import WebhookAuth

MAX_DEFINITION_BYTES = 262_144
MAX_STEPS = 100
MAX_PARENTS = 20
MAX_TEMPLATE_CHARS = 2_048
MAX_NESTING_DEPTH = 20
MAX_STRING_CHARS = 65_536
MAX_NAME_CHARS = 200

STEP_TYPES = ("http_request", "delay", "transform", "wait")
METHODS = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
OPS = ("exists", "eq", "ne", "gt", "gte", "lt", "lte", "in")
RESERVED_NAMES = frozenset({"input", "execution", "secrets", "waits"})
ON_TIMEOUT = ("fail", "continue")
RESUME_AUTH = ("token", "signature")
MAX_WAIT_S = 31_536_000  # a year, like a delay
EXECUTION_FIELDS = ("id", "workflow", "version")

STEP_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
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
    }
)
# SPEC §13: outbound limits, by name; a step names one with `limit`.
_LIMIT_KEYS = frozenset({"rate_per_s", "burst", "concurrency", "circuit"})
_CIRCUIT_KEYS = frozenset({"failures", "window_s", "cool_down_s"})
MAX_CIRCUIT_S = 86_400
MAX_LIMITS = 100
MAX_LIMIT_RATE = 100_000
_CONCURRENCY_KEYS = frozenset({"limit", "key", "on_full", "max_queued"})
ON_FULL = ("queue", "drop_new", "cancel_oldest")
_SCHEDULE_KEYS = frozenset(
    {"cron", "every_s", "timezone", "overlap", "catchup_window_s", "jitter_s", "input"}
)
OVERLAP = ("skip", "buffer_one", "allow", "cancel_other")
MAX_EVERY_S = 31_536_000
MAX_CATCHUP_WINDOW_S = 604_800  # a week
MAX_JITTER_S = 3_600
DEFAULT_CATCHUP_WINDOW_S = 60
# Time limits reach a year at most, like a delay.
MAX_TIME_LIMIT_S = 31_536_000
# How long finished executions are kept (SPEC §11). Fractions are allowed: a test or a
# soak keeps them for minutes. The newest version's value applies to every execution of
# the workflow (flowforge/worker/retention.py reads it from the stored definition).
DEFAULT_RETENTION_DAYS = 30.0
MAX_RETENTION_DAYS = 3650.0
_COMMON_KEYS = frozenset({"id", "type", "depends_on", "when"})
_TYPE_KEYS = {
    "http_request": frozenset({"request", "retry", "budget_s", "limit"}),
    "delay": frozenset({"duration_s", "until"}),
    "transform": frozenset({"output"}),
    "wait": frozenset({"timeout_s", "on_timeout", "auth"}),
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


class DefinitionInvalid(ClientError):
    """The workflow definition breaks the rules of SPEC section 5."""

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
    # SPEC §14: what a step whose tries ran out does to its execution: `fail` it, or
    # `pause` it for an operator (who resumes it to run the step again, or fails it).
    on_exhausted: str = "fail"


# retry.on_exhausted's choices.
ON_EXHAUSTED = ("fail", "pause")


@dataclass(frozen=True)
class Concurrency:
    """How many executions (of one key value) may hold a slot, and what a full one does."""

    limit: int
    key: str | None = None  # a template over `input`; None: one queue for the workflow
    on_full: str = "queue"
    max_queued: int | None = None


@dataclass(frozen=True)
class Circuit:
    """A circuit breaker (SPEC §13): `failures` connection failures or 5xx in a row within
    `window_s` open it for `cool_down_s`; then one probe is let through."""

    failures: int
    window_s: float
    cool_down_s: float


@dataclass(frozen=True)
class LimitSpec:
    """An outbound limit (SPEC §13): at most `rate_per_s` requests a second with bursts of
    `burst`, and at most `concurrency` in flight, counted over every worker. None: no such
    bound."""

    rate_per_s: float | None = None
    burst: int = 1
    concurrency: int | None = None
    circuit: Circuit | None = None


@dataclass(frozen=True)
class Schedule:
    """When a workflow runs by itself (SPEC §9): a cron expression in a zone, or a fixed
    interval; what a tick does while an earlier one is live; how late a tick may still
    fire; how much to spread fires; the input each tick gets."""

    cron: cron.Cron | None
    every_s: int | None
    timezone: str = "UTC"
    overlap: str = "skip"
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
class Step:
    """One validated node of the workflow graph."""

    id: str
    type: str
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
    on_timeout: str = "fail"
    resume_auth: str = "token"
    # http_request: the name of the definition's outbound limit it goes through (a
    # template over input renders one key per value).
    limit: str | None = None

    @property
    def repeat_safe(self) -> bool:
        """Whether running it again after an unknown outcome cannot cause a second effect."""
        return self.request is None or (
            self.request["method"] in SAFE_METHODS or self.request["idempotency_key"] is not None
        )


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
    # How long accepted webhooks' raw requests are kept for re-ingest (flowforge/archive.py);
    # 0, the default, keeps none.
    archive_days: float = 0.0
    schedule: Schedule | None = None
    input_schema: Any = None  # JSON Schema 2020-12 of webhook bodies (flowforge/inputschema.py)
    limits: dict[str, LimitSpec] = field(default_factory=dict, compare=False)
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
        """Find a step by id; the engine holds ids, not Step objects, in its rows."""
        return self._by_id[step_id]

    def children(self, step_id: str) -> tuple[str, ...]:
        """Name the steps that may become ready once this one finishes."""
        return self._children[step_id]

    def ancestors(self, step_id: str) -> frozenset[str]:
        """Name every step whose output this step's templates may read."""
        return self._ancestors[step_id]

    def wait_steps(self) -> tuple[str, ...]:
        """Name the wait steps, whose pending resumes a unit of work must load."""
        return tuple(step.id for step in self.steps if step.type == "wait")

    def roots(self) -> tuple[str, ...]:
        """Name the steps that start as soon as an execution begins."""
        return tuple(step.id for step in self.steps if not step.depends_on)


def is_step_id(text: str) -> bool:
    """Whether text is a whole step id (a full match: no trailing newline slips through)."""
    return STEP_ID.fullmatch(text) is not None


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


def _is_whole(value: Any) -> bool:
    """Tell JSON integers from booleans and floats."""
    return isinstance(value, int) and not isinstance(value, bool)


class _Parser:
    """Walks one definition, recording every problem with its JSON path."""

    def __init__(self, stored: bool) -> None:
        self.errors: list[dict[str, str]] = []
        self.stored = stored
        self.wait_ids: frozenset[str] = frozenset()
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
        if isinstance(steps, list) and len(steps) > MAX_STEPS:
            self.error("$.steps", f"{len(steps)} steps exceed the limit of {MAX_STEPS} steps")
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
        schedule = self.schedule(doc)
        if not isinstance(steps, list) or not steps:
            self.error("$.steps", "steps is required: a non-empty array")
            return None
        concurrency = self.concurrency(doc)
        deadline_s = self.time_limit(doc, "deadline_s")
        start_within_s = self.time_limit(doc, "start_within_s")
        retention_days = self.retention_days(doc)
        archive_days = self.archive_days(doc)
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
            limits=limits,
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
            if not isinstance(spec, dict):
                self.error(where, "a limit is an object with rate_per_s, burst, concurrency")
                continue
            self.unknown_keys(spec, _LIMIT_KEYS, where)
            rate: Any = spec.get("rate_per_s")
            burst: Any = spec.get("burst")
            concurrency: Any = spec.get("concurrency")
            if rate is not None and (not is_number(rate) or not 0 < rate <= MAX_LIMIT_RATE):
                self.error(
                    f"{where}.rate_per_s", f"rate_per_s must be a number in (0, {MAX_LIMIT_RATE}]"
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
            circuit = self.circuit(spec.get("circuit"), f"{where}.circuit")
            if rate is None and concurrency is None and circuit is None:
                self.error(where, "a limit needs rate_per_s, concurrency or circuit")
                continue
            found[name] = LimitSpec(
                rate_per_s=float(rate) if is_number(rate) else None,
                burst=burst if _is_whole(burst) else 1,
                concurrency=concurrency if _is_whole(concurrency) else None,
                circuit=circuit,
            )
        return found

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
        if not _is_whole(failures) or not 1 <= failures <= 1000:
            self.error(f"{path}.failures", "failures is required: an integer from 1 to 1000")
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
        if not _is_whole(limit) or not 1 <= limit <= 100_000:
            self.error(f"{path}.limit", "limit is required: an integer from 1 to 100000")
        key = raw.get("key")
        if "key" in raw:
            self.concurrency_key(key, f"{path}.key")
        on_full = raw.get("on_full", "queue")
        if on_full not in ON_FULL:
            self.error(f"{path}.on_full", f"on_full must be one of {', '.join(ON_FULL)}")
        max_queued: Any = raw.get("max_queued")
        if "max_queued" in raw and (not _is_whole(max_queued) or not 1 <= max_queued <= 10**9):
            self.error(f"{path}.max_queued", "max_queued must be an integer from 1 to 1000000000")
        if not _is_whole(limit) or on_full not in ON_FULL:
            return None
        return Concurrency(limit, key if isinstance(key, str) else None, on_full, max_queued)

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
        self.unknown_keys(webhook, {"auth"}, "$.trigger.webhook")
        auth = webhook.get("auth", "signature")
        if not isinstance(auth, str) or auth not in set(WebhookAuth):
            self.error(
                "$.trigger.webhook.auth",
                f"auth must be one of {', '.join(sorted(WebhookAuth))}",
            )
            return "signature"
        return str(auth)

    def schedule(self, doc: dict[str, Any]) -> Schedule | None:
        """Check `trigger.schedule` (SPEC §9): exactly one of cron and every_s, a zone the
        system's tz database knows, a known overlap policy, bounded windows, object input."""
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
            overlap=overlap,
            catchup_window_s=float(window),
            jitter_s=float(jitter),
            input=given,
        )

    def parse_steps(self, steps: list[Any]) -> tuple[Step, ...]:
        """Check every step and the graph they form; return them in topological order."""
        first_at: dict[str, int] = {}
        for index, raw in enumerate(steps):
            if isinstance(raw, dict) and isinstance(raw.get("id"), str):
                first_at.setdefault(raw["id"], index)
        parents: dict[str, list[str]] = {step_id: [] for step_id in first_at}
        # {{ waits.<id>.url }} may name any wait step of the workflow, not only ancestors.
        self.wait_ids = frozenset(
            raw["id"]
            for raw in steps
            if isinstance(raw, dict)
            and raw.get("type") == "wait"
            and isinstance(raw.get("id"), str)
        )
        edges: list[list[str]] = []
        for index, raw in enumerate(steps):
            if not isinstance(raw, dict):
                self.error(f"$.steps[{index}]", "a step must be an object")
                edges.append([])
                continue
            edges.append(self.depends_on(raw, f"$.steps[{index}]", first_at))
            if self.step_id(raw, index, first_at):
                parents[raw["id"]] = edges[index]
        ordered = _topological(parents)
        for loop in _cycles(parents, set(ordered)):
            self.error(
                f"$.steps[{first_at[loop[0]]}].depends_on",
                "cycle: " + " -> ".join([*loop, loop[0]]),
            )
        parsed: dict[str, Step] = {}
        for index, raw in enumerate(steps):
            if isinstance(raw, dict):
                ancestors = _closure(parents, edges[index])
                step = self.parse_step(raw, f"$.steps[{index}]", ancestors)
                if step is not None:
                    parsed[step.id] = step
        return tuple(parsed[step_id] for step_id in ordered if step_id in parsed)

    def step_id(self, raw: dict[str, Any], index: int, first_at: dict[str, int]) -> bool:
        """Check a step's id; a duplicate is reported where it repeats."""
        step_id = raw.get("id")
        path = f"$.steps[{index}].id"
        if not isinstance(step_id, str) or not STEP_ID.fullmatch(step_id):
            self.error(path, "id is required: a letter or '_' then up to 63 letters, digits or '_'")
        elif step_id in RESERVED_NAMES:
            self.error(path, f"{step_id!r} is reserved for the template context")
        elif first_at[step_id] != index:
            self.error(
                path, f"duplicate step id {step_id!r} (first at $.steps[{first_at[step_id]}])"
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

    def parse_step(self, raw: dict[str, Any], path: str, ancestors: frozenset[str]) -> Step | None:
        """Check one step's type-specific fields, its condition and its templates."""
        step_type = raw.get("type")
        when = self.when(raw, path, ancestors)
        if step_type not in STEP_TYPES:
            self.error(f"{path}.type", f"type must be one of {', '.join(STEP_TYPES)}")
            return None
        self.unknown_keys(raw, _COMMON_KEYS | _TYPE_KEYS[step_type], path)
        request, retry = None, RetryPolicy(max_attempts=1)
        duration_s, until, output, budget_s = None, None, None, None
        timeout_s, on_timeout, resume_auth = None, "fail", "token"
        limit: Any = None
        if step_type == "wait":
            timeout_s, on_timeout, resume_auth = self.wait(raw, path)
        elif step_type == "http_request":
            request = self.request(raw.get("request"), f"{path}.request", ancestors)
            retry = self.retry(raw.get("retry", {}), f"{path}.retry")
            budget_s = self.budget(raw, path, request)
            limit = raw.get("limit")
            if limit is not None and limit not in self.limit_names:
                self.error(f"{path}.limit", "limit must name one of the definition's limits")
        elif step_type == "delay":
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
            type=step_type,
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
        )

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
        timeout_s = request.get("timeout_s", 30)
        if not is_number(timeout_s) or not 0 < timeout_s <= 300:
            self.error(f"{path}.timeout_s", "timeout_s must be a number with 0 < timeout_s <= 300")
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
        """SPEC §12: a request that carries a secret or a resume URL goes where the
        publisher said. Its scheme, host and port may come from a secret (the operator's)
        but not from the execution's data — the input, a step's output — which whoever
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
        if not isinstance(attempts, int) or isinstance(attempts, bool) or not 1 <= attempts <= 20:
            self.error(f"{path}.max_attempts", "max_attempts must be an integer from 1 to 20")
        initial = retry.get("initial_interval_s", default.initial_interval_s)
        if not is_number(initial) or not 0 < initial <= 3600:
            self.error(f"{path}.initial_interval_s", "initial_interval_s must be in (0, 3600]")
        coefficient = retry.get("backoff_coefficient", default.backoff_coefficient)
        if not is_number(coefficient) or not 1 <= coefficient <= 10:
            self.error(f"{path}.backoff_coefficient", "backoff_coefficient must be in [1, 10]")
        maximum = retry.get("max_interval_s", default.max_interval_s)
        if not is_number(maximum) or not maximum <= 86_400:
            self.error(f"{path}.max_interval_s", "max_interval_s must be a number up to 86400")
        elif is_number(initial) and maximum < initial:
            self.error(f"{path}.max_interval_s", "max_interval_s must be >= initial_interval_s")
        on_exhausted = retry.get("on_exhausted", default.on_exhausted)
        if on_exhausted not in ON_EXHAUSTED:
            self.error(f"{path}.on_exhausted", 'on_exhausted must be "fail" or "pause"')
        return RetryPolicy(attempts, initial, coefficient, maximum, on_exhausted)

    def delay(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> tuple[float | None, str | None]:
        """Check that a delay names exactly one way to wait."""
        duration_s: Any = raw.get("duration_s")
        until: Any = raw.get("until")
        if ("duration_s" in raw) == ("until" in raw):
            self.error(path, "a delay needs exactly one of duration_s and until")
        elif "duration_s" in raw:
            if not is_number(duration_s) or not 0 <= duration_s <= 31_536_000:
                self.error(
                    f"{path}.duration_s", "duration_s must be a number from 0 to 31536000 (a year)"
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

    def wait(self, raw: dict[str, Any], path: str) -> tuple[float | None, str, str]:
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
            on_timeout = "fail"
        auth: Any = raw.get("auth", "token")
        if auth not in RESUME_AUTH:
            self.error(
                f"{path}.auth",
                'auth must be "token" (the resume URL alone) or "signature" (also signed'
                " with the workflow's webhook secret)",
            )
            auth = "token"
        return timeout_s, on_timeout, auth

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
