"""The words of the domain, with no I/O: statuses, event kinds, outcomes, requests.

The engine, the worker, the reaper, the timer scanner, the intake and the API all speak
these words; keeping them here lets the pure engine import them without pulling in a
database driver, the HTTP client or the broker client. Each status set is defined once,
here; the SQL CHECK constraints list the same values (tests/integration/test_model_sql.py
reads them back from a migrated database).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class ExecutionStatus(StrEnum):
    """Where an execution stands (docs/contract.md#execution-states); `executions.status`."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    # docs/contract.md#pause: an operator (or its workflow's pause, or a step's exhausted retries
    # under retry.on_exhausted "pause") holds it; nothing starts until it is resumed.
    PAUSED = "paused"
    NEEDS_ATTENTION = "needs_attention"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class WebhookAuth(StrEnum):
    """How a workflow's webhooks prove their sender (docs/contract.md#presets);
    `workflow_versions.webhook_auth`.

    `signature` is Standard Webhooks; the others are the providers' own schemes, verified
    as each provider documents (flowforge/trust/presets.py)."""

    NONE = "none"
    SIGNATURE = "signature"
    STRIPE = "stripe"
    GITHUB = "github"
    SHOPIFY = "shopify"
    SLACK = "slack"


class PauseReason(StrEnum):
    """Why an execution is paused; `executions.pause_reason`."""

    OPERATOR = "operator"
    WORKFLOW = "workflow"
    EXHAUSTED = "exhausted"


class StepStatus(StrEnum):
    """Where one step of an execution stands; `steps.status`."""

    PENDING = "pending"
    READY = "ready"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    UNKNOWN = "unknown"
    CANCELLED = "cancelled"


class StopReason(StrEnum):
    """Why an execution was asked to stop, besides an operator's cancel (None);
    `executions.stop_reason` (docs/contract.md#flow-control)."""

    CONCURRENCY = "concurrency"  # cancel_oldest: a newer execution took its slot
    DEADLINE = "deadline"  # deadline_s passed: it ends `failed`
    EXPIRED = "expired"  # start_within_s passed while it was queued


class OnItemFailure(StrEnum):
    """What a map does when one of its items fails (docs/contract.md#map)."""

    FAIL_FAST = "fail_fast"  # the map fails at once, its other items stop
    COLLECT = "collect"  # every item runs; the map fails at the end, saying how many failed


class ItemStatus(StrEnum):
    """Where one item of a map stands (docs/contract.md#map), derived from its steps' rows: never
    stored, so it cannot disagree with them."""

    QUEUED = "queued"  # not started yet (or started again by a retry)
    RUNNING = "running"  # a step of it is ready, running or waiting
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"  # a step's remote effect is unknown: an operator decides
    CANCELLED = "cancelled"


# Plain strings: an enum member hashes through a Python-level __hash__, and a map's
# items are counted from every row of the execution in each unit of work.
_ITEM_ACTIVE = frozenset({"ready", "running", "waiting"})


def item_status(statuses: set[str]) -> ItemStatus:
    """An item's status from the set of its rows' statuses; no rows yet is `queued`."""
    if not statuses.isdisjoint(_ITEM_ACTIVE):
        return ItemStatus.RUNNING
    if "failed" in statuses:
        return ItemStatus.FAILED
    if "unknown" in statuses:
        return ItemStatus.UNKNOWN
    if "cancelled" in statuses:
        return ItemStatus.CANCELLED
    if not statuses or "pending" in statuses:
        return ItemStatus.QUEUED
    return ItemStatus.SUCCEEDED


class AttemptOutcome(StrEnum):
    """How one attempt ended; `attempts.outcome` (NULL while it is in flight)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    LOST_LEASE = "lost_lease"


class GroupKind(StrEnum):
    """How a workflow gathers its webhooks (docs/contract.md#debounce-batch);
    `intake_groups.kind`."""

    DEBOUNCE = "debounce"
    BATCH = "batch"


class GroupStatus(StrEnum):
    """Where a debounce or batch group stands; `intake_groups.status` (usecases/grouping.py).
    `open` takes events; `closed` is a full batch, due; `started` has its execution;
    `failed` could not start (its workflow was archived first, its concurrency key did not
    render) and is deleted retention_days later."""

    OPEN = "open"
    CLOSED = "closed"
    STARTED = "started"
    FAILED = "failed"


class KeyOrigin(StrEnum):
    """Who made an idempotency key; `idempotency_keys.origin`, part of its primary key
    (docs/contract.md#system-keys). A client's `Idempotency-Key` or `webhook-id` is always `client`,
    whatever it spells; every identity FlowForge makes for itself (a schedule tick's, and any later
    retry, resume or re-ingest key) is `system`, so no client key can claim, block or
    replay one."""

    CLIENT = "client"
    SYSTEM = "system"


class LimitReason(StrEnum):
    """Why a ready step waits for its outbound limit (docs/contract.md#outbound-limits;
    limit_waits.reason)."""

    RATE = "rate"  # its place in the key's rate is later
    CONCURRENCY = "concurrency"  # the key's requests in flight are at its concurrency
    HELD = "held"  # a 429/503 with Retry-After holds the key until then
    CIRCUIT = "circuit"  # the key's circuit is open


class CircuitState(StrEnum):
    """A limit key's circuit breaker (docs/contract.md#circuits; outbound_limits.circuit)."""

    CLOSED = "closed"
    OPEN = "open"  # its steps wait until the cool-down ends
    HALF_OPEN = "half_open"  # one probe is out; its result closes or reopens it


class StepType(StrEnum):
    """What a step does (docs/contract.md#definition); `steps.type`. Only an http_request leaves the
    process: the others are pure and run inside the engine (engine.PURE_TYPES)."""

    HTTP_REQUEST = "http_request"
    DELAY = "delay"
    TRANSFORM = "transform"
    WAIT = "wait"
    MAP = "map"
    # docs/contract.md#child-workflows: starts an execution of another workflow (its child) and
    # waits for it to end.
    WORKFLOW = "workflow"


class OutcomeKind(StrEnum):
    """The verdict on one attempt (Outcome.kind): a retry is a failed attempt the step's
    retry policy may run again."""

    SUCCEEDED = "succeeded"
    RETRY = "retry"
    FAILED = "failed"
    UNKNOWN = "unknown"


class OnFull(StrEnum):
    """What the intake does when a concurrency key's slots are all held (docs/contract.md#slots).
    The first three are a definition's `concurrency.on_full`; `skip` and `buffer_one` are a
    schedule's overlap policies, which the gated intake applies to the schedule's key."""

    QUEUE = "queue"
    DROP_NEW = "drop_new"
    CANCEL_OLDEST = "cancel_oldest"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"


class Overlap(StrEnum):
    """What a schedule's tick does while its previous execution is live
    (docs/contract.md#schedules)."""

    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    ALLOW = "allow"
    CANCEL_OTHER = "cancel_other"

    @property
    def on_full(self) -> OnFull | None:
        """The slot policy a tick takes on its schedule's key (a limit of 1); None for
        `allow`, which takes no slot."""
        return _OVERLAP_ON_FULL.get(self)


_OVERLAP_ON_FULL = {
    Overlap.SKIP: OnFull.SKIP,
    Overlap.BUFFER_ONE: OnFull.BUFFER_ONE,
    Overlap.CANCEL_OTHER: OnFull.CANCEL_OLDEST,
}


class OnTimeout(StrEnum):
    """What a wait step's timeout does: fail the step, or succeed it without a resume."""

    FAIL = "fail"
    CONTINUE = "continue"


class OnExhausted(StrEnum):
    """What a step whose tries ran out does to its execution (docs/contract.md#on-exhausted
    retry.on_exhausted)."""

    FAIL = "fail"
    PAUSE = "pause"


class ItemFailure(StrEnum):
    """What a failed item of a map does to the others (docs/contract.md#map `on_item_failure`):
    stop the map, or let every item finish and fail the map with the list of failures."""

    FAIL_FAST = "fail_fast"
    COLLECT = "collect"


class ResumeAuth(StrEnum):
    """How a wait step's resumes prove who sent them (`auth`): the resume URL alone, or also
    Standard Webhooks headers signed with the workflow's webhook secret."""

    TOKEN = "token"
    SIGNATURE = "signature"


class HttpMethod(StrEnum):
    """The methods an http_request step may send (`request.method`)."""

    GET = "GET"
    HEAD = "HEAD"
    OPTIONS = "OPTIONS"
    POST = "POST"
    PUT = "PUT"
    PATCH = "PATCH"
    DELETE = "DELETE"


class ConditionOp(StrEnum):
    """The comparisons of a step's `when` (docs/contract.md#definition)."""

    EXISTS = "exists"
    EQ = "eq"
    NE = "ne"
    GT = "gt"
    GTE = "gte"
    LT = "lt"
    LTE = "lte"
    IN = "in"


class LedgerOutcome(StrEnum):
    """One row of a schedule's tick ledger (`schedule_ticks.outcome`): a tick's verdict,
    or an operator's pause and resume of the schedule."""

    FIRED = "fired"
    SKIPPED = "skipped"
    BUFFERED = "buffered"
    MISSED = "missed"
    PAUSED = "paused"  # a tick that fell while the schedule was paused
    PAUSE = "pause"
    RESUME = "resume"


class EventKind(StrEnum):
    """The history entries that are not a status transition (see step_event and
    execution_event for those)."""

    EXECUTION_RETRIED = "execution.retried"
    # A cancel, or a flow-control stop (with its reason), was asked for, by its actor.
    CANCEL_REQUESTED = "execution.cancel_requested"
    STEP_RESOLVED = "step.resolved"
    # The reaper recorded an attempt `unknown` while its worker held the answer (a freeze
    # or an outage past the lease); that worker settled it before any operator acted.
    STEP_SETTLED = "step.settled"
    # Flow control (docs/contract.md#flow-control): a slot was handed to the execution; its deadline
    # passed.
    SLOT_GRANTED = "execution.slot_granted"
    DEADLINE_PASSED = "execution.deadline_passed"
    # A wait step ended by its resume URL, by an operator (with the actor), by its timeout.
    WAIT_RESUMED = "wait.resumed"
    WAIT_COMPLETED = "wait.completed"
    WAIT_FAILED = "wait.failed"
    WAIT_TIMED_OUT = "wait.timed_out"
    # docs/contract.md#pause: a workflow paused or resumed (recorded on each execution it touched is
    # the execution's own transition); an operator failed a paused execution; a replay made.
    WORKFLOW_PAUSED = "workflow.paused"
    WORKFLOW_RESUMED = "workflow.resumed"
    EXECUTION_REPLAYED = "execution.replayed"
    EXECUTION_RESUMED = "execution.resumed"
    # A resume onto a version moved a never-started execution to it (from_version, version).
    EXECUTION_REPINNED = "execution.repinned"
    FAIL_REQUESTED = "execution.fail_requested"
    # docs/contract.md#outbound-limits: a ready step waits for its outbound limit (key, reason,
    # until); not an attempt, not a failure. A 429/503 with Retry-After held a key for everyone.
    STEP_LIMITED = "step.limited"
    LIMIT_HELD = "limit.held"
    # docs/contract.md#child-workflows: a workflow step started its child execution; the child needs
    # an operator (the parent keeps waiting, visibly); the child ended (with its status).
    CHILD_STARTED = "child.started"
    CHILD_NEEDS_ATTENTION = "child.needs_attention"
    CHILD_ENDED = "child.ended"


# Who acted, in the history of an operator action or a stop (docs/contract.md#actors): an API key
# ({"kind": "api_key", "id", "name"}), the CLI on the box ({"kind": "cli", "name":
# "cli@host"}), or FlowForge itself. Callers copy it into event details, never mutate it.
FLOW_CONTROL_ACTOR: dict[str, Any] = {"kind": "system", "name": "flow control"}
# Who cancels a child execution (docs/contract.md#child-workflows) when its parent's workflow step
# is cancelled.
PARENT_CANCEL_ACTOR: dict[str, Any] = {"kind": "system", "name": "parent execution"}
# Who pauses an execution of a paused workflow the moment a worker touches it.
WORKFLOW_PAUSE_ACTOR: dict[str, Any] = {"kind": "system", "name": "workflow pause"}


def step_event(status: str) -> str:
    """The history kind of a step entering `status`: `step.ready`."""
    return f"step.{status}"


def execution_event(status: str) -> str:
    """The history kind of an execution entering `status`: `execution.running`."""
    return f"execution.{status}"


def transition(previous: str, status: str) -> dict[str, Any]:
    """The detail of a status transition in the history: `{"from": ..., "to": ...}`."""
    return {"from": str(previous), "to": str(status)}


def step_moved(previous: str, status: str) -> tuple[str, dict[str, Any]]:
    """A step's move from `previous` to `status` as the history records it: the event's
    kind and detail (for the set-based statements that write history rows themselves)."""
    return step_event(status), transition(previous, status)


def execution_moved(previous: str, status: str) -> tuple[str, dict[str, Any]]:
    """An execution's move from `previous` to `status` as the history records it."""
    return execution_event(status), transition(previous, status)


# A workflow key, as the database's CHECK requires (match it whole: fullmatch).
WORKFLOW_KEY = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
# How deep child workflows nest (docs/contract.md#child-workflows) unless FLOWFORGE_MAX_CHILD_DEPTH
# says otherwise: an execution started by a webhook is at depth 0, its child at 1.
DEFAULT_MAX_CHILD_DEPTH = 8
# How many executions one root may have below it, all depths together (docs/reference/
# definition.md), unless FLOWFORGE_MAX_DESCENDANTS says otherwise: without it, 100 workflow
# steps per version at depth 8 could make 10^16 executions out of one webhook.
DEFAULT_MAX_DESCENDANTS = 1000


def is_key(text: str) -> bool:
    """Whether text is a whole workflow key, as the database's CHECK requires."""
    return WORKFLOW_KEY.fullmatch(text) is not None


# The largest page a list answers (API `limit`, CLI `--limit`).
MAX_PAGE = 200
DEFAULT_PAGE = 50
# Request bounds the API checks and /openapi.json states (one source for both).
MAX_VERSION = 2**31 - 1  # a version number is an int4
MAX_ERROR_FILTER_CHARS = 500  # a bulk replay's filter.error
MAX_IDEMPOTENCY_KEY = 255  # a webhook's identity: webhook-id or Idempotency-Key

# How long a claimed step is leased unless FLOWFORGE_LEASE_SECONDS says otherwise.
DEFAULT_LEASE_S = 60.0
# Worker liveness (worker_heartbeats): a worker beats at least this often, and one silent
# for WORKER_DEAD_AFTER_S is dead: its leases are expired at once (worker/recovery.py).
WORKER_BEAT_S = 2.0
WORKER_DEAD_AFTER_S = 10.0
TERMINAL_EXECUTION = frozenset(
    {ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED}
)
# An operator retry re-runs these steps; `succeeded` and `unknown` are never reset.
RETRIED_STEP = frozenset({StepStatus.FAILED, StepStatus.CANCELLED})
# Steps whose dependents may start: their work is done (or was never to be done).
DONE_STEP = frozenset({StepStatus.SUCCEEDED, StepStatus.SKIPPED})
# Steps that ended for good; an `unknown` one ended too, until an operator resolves it.
FINAL_STEP = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.CANCELLED}
)
# Cancel stops these at once; `running` steps stop at their next boundary.
CANCELLABLE_STEP = frozenset({StepStatus.PENDING, StepStatus.READY, StepStatus.WAITING})
# The statuses of an execution that is not over, in declaration order: the set the partial
# live indexes, the slot holders and the gauges read (SQL spells it with sql_list).
LIVE_EXECUTION = tuple(s for s in ExecutionStatus if s not in TERMINAL_EXECUTION)
# What a paused execution was doing before (`executions.paused_from`): any live status but
# paused itself.
PAUSABLE = tuple(s for s in LIVE_EXECUTION if s != ExecutionStatus.PAUSED)


def sql_list(values: tuple[StrEnum, ...]) -> str:
    """A closed set of the domain's words as an SQL list, `('queued', 'running')`: written
    once here so no statement spells a status set out by hand (the values are enum
    members, never input)."""
    return "(" + ", ".join(f"'{value.value}'" for value in values) + ")"


LIVE_EXECUTION_SQL = sql_list(LIVE_EXECUTION)
# What an operator may resolve an unknown step as (a tuple: a JSON object is unhashable).
RESOLUTIONS = (AttemptOutcome.SUCCEEDED.value, AttemptOutcome.FAILED.value)


@dataclass(frozen=True)
class Outcome:
    """The verdict on one attempt."""

    kind: OutcomeKind
    output: Any = None
    error: str | None = None
    http_status: int | None = None
    duration_ms: int | None = None
    retry_after_s: float | None = None
    # A dated Retry-After that came without a usable Date header: the checkpoint reads it
    # against the database's clock into retry_after_s (docs/contract.md, "Outbound limits").
    retry_at: datetime | None = None
    # The attempt's own record of the answer (attempts.response), redacted and capped.
    response: dict[str, Any] | None = None

    @property
    def attempt_outcome(self) -> str:
        """The attempt row's outcome: a retry is a failed attempt."""
        return (
            AttemptOutcome.FAILED if self.kind == OutcomeKind.RETRY else AttemptOutcome(self.kind)
        )


@dataclass(frozen=True)
class ExecutionQuery:
    """Which executions one page of the list holds, newest first: the API's
    GET /api/v1/executions and `flowforge execution list` (remote or on the box) ask the
    same question. Created in [since, until) when given; `workflows` is the API key's
    scope (None: every workflow)."""

    workflow: str | None = None
    status: str | None = None
    limit: int = 50
    cursor: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    workflows: tuple[str, ...] | None = None
    # docs/contract.md#search-attributes: (name, value) pairs an execution must all have.
    attributes: tuple[tuple[str, str], ...] = ()


class NotifyKind(StrEnum):
    """What a notification endpoint may subscribe to (docs/contract.md#notifications),
    each recorded by a trigger of sql/0060, or (queue.full) by the refused intake through
    sql/0067's notify_queue_full."""

    EXECUTION_FAILED = "execution.failed"
    OUTCOME_UNKNOWN = "outcome.unknown"
    EXECUTION_PAUSED = "execution.paused"  # paused on exhausted retries
    CIRCUIT_OPENED = "circuit.opened"
    QUEUE_FULL = "queue.full"  # concurrency.max_queued reached; again once below half
    # docs/contract.md#failure-groups: a new failure group, or a resolved one recurring
    # (sql/0063): one event per group opening, never one per execution.
    FAILURE_GROUP_OPENED = "failure_group.opened"


class FailureGroupStatus(StrEnum):
    """A failure group's status (docs/contract.md#failure-groups); `failure_groups.status`.
    A resolved group that fails again is open again; an ignored one stays ignored."""

    OPEN = "open"
    RESOLVED = "resolved"
    IGNORED = "ignored"


class FailureOutcome(StrEnum):
    """What a failure group's executions became: failed, or held for an operator because a
    step's outcome is unknown; `failure_groups.outcome`."""

    FAILED = "failed"
    UNKNOWN = "unknown"


class DeliveryStatus(StrEnum):
    """A notification message's life (sql/0060): pending until its receiver answers 2xx
    (delivered) or its retries run out or its endpoint is disabled (failed)."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class NotifyShape(StrEnum):
    """What a notification endpoint receives; `notify_endpoints.shape`."""

    STANDARD = "standard"  # Standard Webhooks-signed JSON
    SLACK = "slack"  # an incoming webhook's {"text": ...}
