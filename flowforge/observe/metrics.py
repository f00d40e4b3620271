"""Every Prometheus series FlowForge exports, defined once, with prometheus_client.

Two kinds (docs/reference/metrics.md):

- Counters and histograms each process counts as it works. bin/api runs gunicorn in
  multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set up by flowforge/launcher.py before
  prometheus_client is imported), so `/metrics` sums its workers; each bin/worker serves
  its own on FLOWFORGE_METRICS_PORT. Counters of work done in a unit of work are counted
  only after its COMMIT (the store hands what was saved to `saved`, see runs.listen), so a
  rolled-back transaction counts nothing. What happened is the engine's word
  (engine.happened, engine.since_resume): this module counts, it interprets nothing.
- Gauges the API reads from PostgreSQL at scrape time: they live with the store
  (flowforge/store/gauges.py), so this module counts and never queries.

A zero-valued series never disappears: every label value known in advance (outcomes,
step types, refusal reasons) is created at import, and the children used on hot paths
are bound once here, never looked up per call.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from flowforge.domain.changes import NOTHING_HAPPENED, happened
from flowforge.domain.definitions import STEP_TYPES
from flowforge.domain.model import TERMINAL_EXECUTION, AttemptOutcome, EventKind, LedgerOutcome

if TYPE_CHECKING:
    from flowforge.domain.engine import Changes

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

SHORT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LONG = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0)

# ---- the API: webhooks and resume URLs ---------------------------------------------
WEBHOOKS_ACCEPTED = Counter(
    "flowforge_webhooks_accepted",
    "Webhooks answered 202: a new execution, or a replay of one (Idempotent-Replayed).",
    ["replayed"],
)
WEBHOOKS_REFUSED = Counter(
    "flowforge_webhooks_refused", "Webhooks answered with a problem, by reason.", ["reason"]
)
SOURCE_EVENTS = Counter(
    "flowforge_source_events",
    "Events received by a source (POST /hooks/<source>), by whether a subscription matched.",
    ["source", "outcome"],
)
SOURCE_MATCHES = Counter(
    "flowforge_source_matches",
    "Executions started (or replayed) by a source's subscription.",
    ["source", "subscription"],
)


def count_routed(source: str, subscriptions: list[str]) -> None:
    """Count one routed event after its transaction committed: matched or unmatched, and
    one per subscription that matched. Label values are operator-defined names (a source
    holds at most 50 subscriptions), never sender data."""
    SOURCE_EVENTS.labels(source, "matched" if subscriptions else "unmatched").inc()
    for name in subscriptions:
        SOURCE_MATCHES.labels(source, name).inc()


INTAKE_TARGET_READS = Counter(
    "flowforge_intake_target_reads",
    "Reads of an intake target (a workflow's newest version and active secrets, or a "
    "source) from PostgreSQL: first webhooks per process, unknown keys, and re-checks after "
    "a signature the cache did not verify (per target and process: 5, then 1 per second).",
)
RESUMES = Counter(
    "flowforge_resumes",
    "Requests to resume URLs (POST /hooks/resume/<token>), by answer.",
    ["outcome"],
)
# The reason of a refusal, from its status (the webhook and resume routes answer each
# status for one reason only, except 429: see refusal_reason).
REFUSAL_REASONS = {
    400: "bad_request",  # malformed JSON, a query string, a bad Idempotency-Key
    401: "signature",
    404: "not_found",  # no such workflow / no such resume URL
    409: "conflict",
    410: "gone",
    413: "too_large",
    415: "unsupported_media_type",
    422: "unresolved_key",  # the concurrency key template does not resolve
    429: "rate_limited",  # FLOWFORGE_WEBHOOK_RATE; "queue_full" for max_queued
    503: "unavailable",
}
OTHER_REFUSAL = "error"  # a 500, or a status not listed above
QUEUE_FULL_TYPE = "urn:flowforge:problem:queue-full"
WEBHOOK_REASONS = sorted({*REFUSAL_REASONS.values(), "queue_full", OTHER_REFUSAL} - {"gone"})
RESUME_OUTCOMES = sorted(
    {"accepted", "replayed", *REFUSAL_REASONS.values(), OTHER_REFUSAL}
    - {"unresolved_key", "rate_limited"}
)

# ---- steps, attempts and executions (counted where a unit of work commits) ------------
ATTEMPTS = Counter(
    "flowforge_attempts", "Finished step attempts, by step type and outcome.", ["type", "outcome"]
)
STEP_DURATION = Histogram(
    "flowforge_step_duration_seconds",
    "From a step's first start to its end (succeeded, failed or unknown), by step type.",
    ["type"],
    buckets=LONG,
)
EXECUTION_DURATION = Histogram(
    "flowforge_execution_duration_seconds",
    "From an execution's acceptance to its end, by final status.",
    ["status"],
    buckets=LONG,
)
WAITS_STARTED = Counter(
    "flowforge_waits_started", "Wait steps that began waiting for a resume or their timeout."
)
WAITS_ENDED = Counter(
    "flowforge_waits_ended",
    "Wait steps that ended: resumed (by the URL, also a resume kept until the wait began), "
    "timed_out, or completed / failed by an operator.",
    ["outcome"],
)
RESUME_LATENCY = Histogram(
    "flowforge_resume_latency_seconds",
    "From a wait step's resume (its commit) to the first start of a step after it.",
    buckets=SHORT,
)

# ---- the worker -------------------------------------------------------------------
TIMER_LAG = Histogram(
    "flowforge_timer_lag_seconds",
    "How late the timer scanner woke a due step (delays, retry back-offs, wait timeouts).",
    buckets=SHORT,
)
LEASES_LOST = Counter(
    "flowforge_leases_lost", "Leases this worker found taken over by another worker."
)
WRITES_FENCED = Counter(
    "flowforge_writes_fenced",
    "Work a stale fencing token kept back: a checkpoint discarded, or a request not sent.",
    ["what"],
)
TAKEN_FIRST = Counter(
    "flowforge_priority_taken_first",
    "Wake-ups that took a better ready step (a higher priority, ranked earlier) before the "
    "one they named; that one was dispatched again.",
)
WAKEUPS_PUBLISHED = Counter(
    "flowforge_wakeups_published", "Wake-ups the relay published and RabbitMQ confirmed."
)
BROKER_RECONNECTS = Counter(
    "flowforge_broker_reconnects",
    "RabbitMQ connections opened again after the first, by component.",
    ["component"],
)
DEAD_LETTERED = Counter(
    "flowforge_dead_lettered",
    "Messages the consumer rejected to the dead-letter queue, by reason.",
    ["reason"],
)
WORKER_HEARTBEAT = Gauge(
    "flowforge_worker_heartbeat_timestamp_seconds",
    "When this worker's heartbeat thread last ran (Unix time).",
    ["worker"],
    multiprocess_mode="max",
)

# ---- schedules (docs/contract.md#schedules) ------------------------------------------------------
# Counted by worker/scheduler.record after each tick's commit.
SCHEDULE_TICKS = Counter(
    "flowforge_schedule_ticks", "Schedule ticks, by what became of them.", ["outcome"]
)
SCHEDULE_LAG = Histogram(
    "flowforge_schedule_lag_seconds",
    "From a schedule tick's due time to the execution it started.",
    buckets=SHORT,
)
INTAKE_GROUPS = Counter(
    "flowforge_intake_groups",
    "Due debounce and batch groups the scheduler handled, by kind and outcome:"
    " started, deferred (queue full: tried again later), failed (workflow archived, or its"
    " concurrency key does not render).",
    ["kind", "outcome"],
)
FAILURE_GROUPS_OPENED = Counter(
    "flowforge_failure_groups_opened",
    "Failure groups opened (docs/contract.md#failure-groups): a new group of failed or unknown"
    " executions, or a resolved one that failed again. One per opening, not per execution;"
    " an ignored group never counts.",
)
SCHEDULE_OUTCOMES = (
    LedgerOutcome.FIRED,
    LedgerOutcome.SKIPPED,
    LedgerOutcome.BUFFERED,
    LedgerOutcome.MISSED,
    LedgerOutcome.PAUSED,
)

# Children bound once (hot paths index these dicts, never call .labels()).
ACCEPTED = WEBHOOKS_ACCEPTED.labels(replayed="false")
REPLAYED = WEBHOOKS_ACCEPTED.labels(replayed="true")
REFUSED = {reason: WEBHOOKS_REFUSED.labels(reason=reason) for reason in WEBHOOK_REASONS}
RESUMED = {outcome: RESUMES.labels(outcome=outcome) for outcome in RESUME_OUTCOMES}
ATTEMPT_CHILDREN: dict[tuple[str, str], Counter] = {
    (kind, outcome.value): ATTEMPTS.labels(type=kind, outcome=outcome.value)
    for kind in STEP_TYPES
    for outcome in AttemptOutcome
}
STEP_DURATIONS: dict[str, Histogram] = {
    kind: STEP_DURATION.labels(type=kind) for kind in STEP_TYPES
}
EXECUTION_DURATIONS = {
    str(status): EXECUTION_DURATION.labels(status=str(status)) for status in TERMINAL_EXECUTION
}
WAIT_ENDS = {
    EventKind.WAIT_RESUMED.value: WAITS_ENDED.labels(outcome="resumed"),
    EventKind.WAIT_TIMED_OUT.value: WAITS_ENDED.labels(outcome="timed_out"),
    EventKind.WAIT_COMPLETED.value: WAITS_ENDED.labels(outcome="completed"),
    EventKind.WAIT_FAILED.value: WAITS_ENDED.labels(outcome="failed"),
}
CHECKPOINT_FENCED = WRITES_FENCED.labels(what="checkpoint")
REQUEST_FENCED = WRITES_FENCED.labels(what="request")
RECONNECTS = {name: BROKER_RECONNECTS.labels(component=name) for name in ("consumer", "relay")}
MALFORMED_DEAD_LETTERED = DEAD_LETTERED.labels(reason="malformed")
FAILED_DEAD_LETTERED = DEAD_LETTERED.labels(reason="failed")
TICKS = {outcome: SCHEDULE_TICKS.labels(outcome=outcome) for outcome in SCHEDULE_OUTCOMES}


def refusal_reason(status: int, problem_type: str | None = None) -> str:
    """The `reason` label of a refused webhook or resume."""
    if status == 429 and problem_type == QUEUE_FULL_TYPE:
        return "queue_full"
    return REFUSAL_REASONS.get(status, OTHER_REFUSAL)


# ---- counting what a unit of work did --------------------------------------------------


def saved(changes: Changes) -> None:
    """Count what one committed unit of work did, as the engine says it (engine.happened):
    attempts, step and execution ends, waits begun and ended. The store calls it after the
    COMMIT (runs.listen: the API and the worker subscribe it), so a rolled-back change
    counts nothing."""
    if changes.failure_group_opened:
        FAILURE_GROUPS_OPENED.inc()
    done = happened(changes)
    if done is NOTHING_HAPPENED:
        return
    for kind, outcome in done.attempts_ended:
        child = ATTEMPT_CHILDREN.get((kind, outcome))
        if child is None:
            child = ATTEMPTS.labels(type=kind, outcome=outcome)
        child.inc()
    if done.waits_started:
        WAITS_STARTED.inc(done.waits_started)
    for end in done.waits_ended:
        WAIT_ENDS[end].inc()
    for kind, took in done.steps_ended:
        if kind in STEP_DURATIONS:
            STEP_DURATIONS[kind].observe(took)
    if done.execution_ended in EXECUTION_DURATIONS:
        accepted = _accepted_at(changes.execution_id)
        if accepted is not None:
            EXECUTION_DURATIONS[done.execution_ended].observe(max(0.0, time.time() - accepted))


def _accepted_at(execution_id: str) -> float | None:
    """When the intake made the execution (Unix time): the millisecond clock in its
    UUIDv7 id (intake.uuid7), so no column is read for it."""
    value = uuid.UUID(str(execution_id))
    if value.version != 7:
        return None
    return (value.int >> 80) / 1000.0


def resumed_step_started(seconds: float) -> None:
    """Resume latency: a step after a resumed wait started `seconds` after the resume
    (engine.since_resume; the executor counts it once its claim commits)."""
    RESUME_LATENCY.observe(seconds)
