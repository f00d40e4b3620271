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
from enum import StrEnum
from typing import Any


class ExecutionStatus(StrEnum):
    """Where an execution stands (SPEC §6); `executions.status`."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    # SPEC §14: an operator (or its workflow's pause, or a step's exhausted retries under
    # retry.on_exhausted "pause") holds it; nothing starts until it is resumed.
    PAUSED = "paused"
    NEEDS_ATTENTION = "needs_attention"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class WebhookAuth(StrEnum):
    """How a workflow's webhooks prove their sender (SPEC §15); `workflow_versions.webhook_auth`.

    `signature` is Standard Webhooks; the others are the providers' own schemes, verified
    as each provider documents (flowforge/presets.py)."""

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


class AttemptOutcome(StrEnum):
    """How one attempt ended; `attempts.outcome` (NULL while it is in flight)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    LOST_LEASE = "lost_lease"


class KeyOrigin(StrEnum):
    """Who made an idempotency key; `idempotency_keys.origin`, part of its primary key
    (SPEC §12). A client's `Idempotency-Key` or `webhook-id` is always `client`, whatever
    it spells; every identity FlowForge makes for itself (a schedule tick's, and any later
    retry, resume or re-ingest key) is `system`, so no client key can claim, block or
    replay one."""

    CLIENT = "client"
    SYSTEM = "system"


class LimitReason(StrEnum):
    """Why a ready step waits for its outbound limit (SPEC §13; limit_waits.reason)."""

    RATE = "rate"  # its place in the key's rate is later
    CONCURRENCY = "concurrency"  # the key's requests in flight are at its concurrency
    HELD = "held"  # a 429/503 with Retry-After holds the key until then
    CIRCUIT = "circuit"  # the key's circuit is open


class CircuitState(StrEnum):
    """A limit key's circuit breaker (SPEC §13; outbound_limits.circuit)."""

    CLOSED = "closed"
    OPEN = "open"  # its steps wait until the cool-down ends
    HALF_OPEN = "half_open"  # one probe is out; its result closes or reopens it


class EventKind(StrEnum):
    """The history entries that are not a status transition (see step_event and
    execution_event for those)."""

    EXECUTION_RETRIED = "execution.retried"
    # A cancel, or a flow-control stop (with its reason), was asked for, by its actor.
    CANCEL_REQUESTED = "execution.cancel_requested"
    STEP_RESOLVED = "step.resolved"
    # Flow control (SPEC §8): a slot was handed to the execution; its deadline passed.
    SLOT_GRANTED = "execution.slot_granted"
    DEADLINE_PASSED = "execution.deadline_passed"
    # A wait step ended by its resume URL, by an operator (with the actor), by its timeout.
    WAIT_RESUMED = "wait.resumed"
    WAIT_COMPLETED = "wait.completed"
    WAIT_FAILED = "wait.failed"
    WAIT_TIMED_OUT = "wait.timed_out"
    # SPEC §14: a workflow paused or resumed (recorded on each execution it touched is the
    # execution's own transition); an operator failed a paused execution; a replay made.
    WORKFLOW_PAUSED = "workflow.paused"
    WORKFLOW_RESUMED = "workflow.resumed"
    EXECUTION_REPLAYED = "execution.replayed"
    EXECUTION_RESUMED = "execution.resumed"
    FAIL_REQUESTED = "execution.fail_requested"
    # SPEC §13: a ready step waits for its outbound limit (key, reason, until); not an
    # attempt, not a failure. A 429/503 with Retry-After held a key for everyone.
    STEP_LIMITED = "step.limited"
    LIMIT_HELD = "limit.held"


# Who acted, in the history of an operator action or a stop (SPEC §11): an API key
# ({"kind": "api_key", "id", "name"}), the CLI on the box ({"kind": "cli", "name":
# "cli@host"}), or FlowForge itself. Callers copy it into event details, never mutate it.
FLOW_CONTROL_ACTOR: dict[str, Any] = {"kind": "system", "name": "flow control"}
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


# A workflow key, as the database's CHECK requires (match it whole: fullmatch).
WORKFLOW_KEY = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
# The largest page a list answers (API `limit`, CLI `--limit`).
MAX_PAGE = 200

# How long a claimed step is leased unless FLOWFORGE_LEASE_SECONDS says otherwise.
DEFAULT_LEASE_S = 60.0
# Worker liveness (worker_heartbeats): a worker beats at least this often, and one silent
# for WORKER_DEAD_AFTER_S is dead: its leases are expired at once (worker/recovery.py).
WORKER_BEAT_S = 2.0
WORKER_DEAD_AFTER_S = 10.0
TERMINAL_EXECUTION = frozenset(
    {ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED}
)
# What an operator may resolve an unknown step as (a tuple: a JSON object is unhashable).
RESOLUTIONS = (AttemptOutcome.SUCCEEDED.value, AttemptOutcome.FAILED.value)


@dataclass(frozen=True)
class Outcome:
    """The verdict on one attempt."""

    kind: str  # succeeded | retry | failed | unknown
    output: Any = None
    error: str | None = None
    http_status: int | None = None
    duration_ms: int | None = None
    retry_after_s: float | None = None
    # The attempt's own record of the answer (attempts.response), redacted and capped.
    response: dict[str, Any] | None = None

    @property
    def attempt_outcome(self) -> str:
        """The attempt row's outcome: a retry is a failed attempt."""
        return AttemptOutcome.FAILED if self.kind == "retry" else self.kind
