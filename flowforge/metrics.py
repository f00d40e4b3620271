"""Every Prometheus series FlowForge exports, defined once, with prometheus_client.

Two kinds (docs/reference/metrics.md):

- Counters and histograms each process counts as it works. bin/api runs gunicorn in
  multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set up by flowforge/launcher.py before
  prometheus_client is imported), so `/metrics` sums its workers; each bin/worker serves
  its own on FLOWFORGE_METRICS_PORT. Counters of work done in a unit of work are counted
  only after its COMMIT (`after_commit`), so a rolled-back transaction counts nothing.
- Gauges the API reads from PostgreSQL at scrape time (`DatabaseGauges`), one cheap query
  each: live rows through the partial indexes on live statuses, table sizes from the
  planner's estimate; none scans a whole table (tests/integration/test_metrics.py
  EXPLAINs each one).

A zero-valued series never disappears: every label value known in advance (outcomes,
step types, refusal reasons) is created at import, and the children used on hot paths
are bound once here, never looked up per call.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING

import psycopg
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from flowforge import attention, flowcontrol
from flowforge.db import one
from flowforge.definitions import STEP_TYPES
from flowforge.model import (
    TERMINAL_EXECUTION,
    AttemptOutcome,
    EventKind,
    ExecutionStatus,
    StepStatus,
    step_event,
)

if TYPE_CHECKING:
    from flowforge.engine import Changes, Run

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
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
    "Reads of a workflow's intake target (newest version, active secrets) from PostgreSQL: "
    "first webhooks per process, and re-checks after a signature the cache did not verify.",
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

# ---- schedules (SPEC §9) --------------------------------------------------------------
# Counted by worker/scheduler.record after each tick's commit.
SCHEDULE_TICKS = Counter(
    "flowforge_schedule_ticks", "Schedule ticks, by what became of them.", ["outcome"]
)
SCHEDULE_LAG = Histogram(
    "flowforge_schedule_lag_seconds",
    "From a schedule tick's due time to the execution it started.",
    buckets=SHORT,
)
SCHEDULE_OUTCOMES = ("fired", "skipped", "buffered", "missed", "paused")

# Children bound once (hot paths index these dicts, never call .labels()).
ACCEPTED = WEBHOOKS_ACCEPTED.labels(replayed="false")
REPLAYED = WEBHOOKS_ACCEPTED.labels(replayed="true")
REFUSED = {reason: WEBHOOKS_REFUSED.labels(reason=reason) for reason in WEBHOOK_REASONS}
RESUMED = {outcome: RESUMES.labels(outcome=outcome) for outcome in RESUME_OUTCOMES}
ATTEMPT_CHILDREN = {
    (kind, outcome.value): ATTEMPTS.labels(type=kind, outcome=outcome.value)
    for kind in STEP_TYPES
    for outcome in AttemptOutcome
}
STEP_DURATIONS = {kind: STEP_DURATION.labels(type=kind) for kind in STEP_TYPES}
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

WAITING_EVENT = step_event(StepStatus.WAITING)
TIMED_STEP_ENDS = frozenset({StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.UNKNOWN})


def refusal_reason(status: int, problem_type: str | None = None) -> str:
    """The `reason` label of a refused webhook or resume."""
    if status == 429 and problem_type == QUEUE_FULL_TYPE:
        return "queue_full"
    return REFUSAL_REASONS.get(status, OTHER_REFUSAL)


# ---- counting after the commit ---------------------------------------------------------
_pending = threading.local()


@contextmanager
def after_commit() -> Iterator[None]:
    """Hold what `saved` and `step_started` record until the block ends without an error
    (runs.unit_of_work puts it outside the transaction, so that is after the COMMIT)."""
    if getattr(_pending, "queue", None) is not None:
        yield  # nested: the outermost block counts
        return
    queue: list[Callable[[], None]] = []
    _pending.queue = queue
    try:
        yield
    finally:
        _pending.queue = None
    for count in queue:
        count()


def _later(count: Callable[[], None]) -> None:
    queue = getattr(_pending, "queue", None)
    if queue is None:
        count()
    else:
        queue.append(count)


def on_commit(record: Callable[[], None]) -> None:
    """Run `record` once the unit of work commits (at once outside one); the tracing
    hooks use it too, so a rolled-back change writes no span."""
    _later(record)


def saved(changes: Changes) -> None:
    """Count what one unit of work changed (runs.save_run): attempts, step and execution
    ends, waits begun and ended."""
    if changes.events or changes.finished_attempts or changes.new_attempts:
        _later(lambda: _count_changes(changes))


def _count_changes(changes: Changes) -> None:
    steps = changes.steps
    ended = [(a.step_id, a.outcome) for a in changes.new_attempts if a.outcome is not None]
    ended += [(a.step_id, a.outcome) for a in changes.finished_attempts]
    for step_id, outcome in ended:
        state = steps.get(step_id)
        kind = state.type if state is not None else "http_request"
        child = ATTEMPT_CHILDREN.get((kind, outcome))
        if child is None:
            child = ATTEMPTS.labels(type=kind, outcome=outcome)
        child.inc()
    for event_step, event, _detail in changes.events:
        if event == WAITING_EVENT:
            state = steps.get(event_step or "")
            if state is not None and state.type == "wait":
                WAITS_STARTED.inc()
        elif (wait_end := WAIT_ENDS.get(event)) is not None:
            wait_end.inc()
    for state in steps.values():
        if (
            state.status in TIMED_STEP_ENDS
            and state.started_at is not None
            and state.finished_at is not None
            and state.type in STEP_DURATIONS
        ):
            took = (state.finished_at - state.started_at).total_seconds()
            STEP_DURATIONS[state.type].observe(max(0.0, took))
    if changes.execution_changed and changes.status in EXECUTION_DURATIONS:
        accepted = _accepted_at(changes.execution_id)
        if accepted is not None:
            took = time.time() - accepted
            EXECUTION_DURATIONS[changes.status].observe(max(0.0, took))


def _accepted_at(execution_id: str) -> float | None:
    """When the intake made the execution (Unix time): the millisecond clock in its
    UUIDv7 id (intake.uuid7), so no column is read for it."""
    value = uuid.UUID(str(execution_id))
    if value.version != 7:
        return None
    return (value.int >> 80) / 1000.0


def step_started(run: Run, step_id: str) -> None:
    """Resume latency: `step_id` starts for the first time now (the worker's claim, or a
    pure step run); if a parent is a wait step its resume ended, count how long ago."""
    state = run.steps[step_id]
    if state.attempts > 0 or state.started_at is not None:
        return
    for parent in run.definition.step(step_id).depends_on:
        wait = run.steps[parent]
        # A resumed (or operator-completed) wait clears wake_at; a timed-out one keeps it.
        if (
            wait.type == "wait"
            and wait.status == StepStatus.SUCCEEDED
            and wait.wake_at is None
            and wait.finished_at is not None
        ):
            latency = max(0.0, (run.now - wait.finished_at).total_seconds())
            _later(partial(RESUME_LATENCY.observe, latency))
            return


# ---- gauges read from PostgreSQL ---------------------------------------------------------
# Live executions by status, through executions_by_status (status, id): the count reads
# the live rows' index entries only, however many finished ones the table holds.
LIVE_EXECUTIONS = """
SELECT status, count(*) FROM executions
WHERE status IN ('queued', 'running', 'waiting', 'paused', 'needs_attention')
GROUP BY status
"""
LIVE_EXECUTION_STATUSES = [
    s.value for s in ExecutionStatus if s not in TERMINAL_EXECUTION
]  # queued, running, waiting, paused, needs_attention
# Each count is served by the matching partial index on steps (steps_ready, steps_running,
# steps_waiting, steps_unknown).
LIVE_STEPS = """
SELECT 'ready', count(*) FROM steps WHERE status = 'ready'
UNION ALL SELECT 'running', count(*) FROM steps WHERE status = 'running'
UNION ALL SELECT 'waiting', count(*) FROM steps WHERE status = 'waiting'
UNION ALL SELECT 'unknown', count(*) FROM steps WHERE status = 'unknown'
"""
LIVE_STEP_STATUSES = ["ready", "running", "waiting", "unknown"]
# The first entry of steps_ready (ready_at): when the oldest ready step's wake-up was sent.
# A step that waits for an outbound limit (SPEC §13) is not stuck: it has a wake time.
OLDEST_READY = """
SELECT coalesce(extract(epoch FROM now() - min(ready_at)), 0) FROM steps s
WHERE status = 'ready'
  AND NOT EXISTS (SELECT 1 FROM limit_waits w WHERE w.execution_id = s.execution_id
                  AND w.step_id = s.step_id AND NOT w.woken)
"""
# Outbound limits (SPEC §13): circuits not closed, and steps waiting for a limit.
OUTBOUND_GAUGES = """
SELECT (SELECT count(*) FROM outbound_limits WHERE circuit <> 'closed'),
       (SELECT count(*) FROM limit_waits WHERE NOT woken)
"""
# The outbox holds only wake-ups not yet confirmed by RabbitMQ (the relay deletes each
# once confirmed): its whole size is the backlog, not a history.
OUTBOX_BACKLOG = (
    "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) FROM outbox"
)
# Wait steps waiting for a resume; served by the partial index steps_waiting.
OPEN_WAITS = "SELECT count(*) FROM steps WHERE status = 'waiting' AND type = 'wait'"
EXPIRED_LEASES = "SELECT count(*) FROM steps WHERE status = 'running' AND lease_expires_at < now()"
# The planner's row estimates (pg_class.reltuples, kept by autovacuum's ANALYZE): the size
# of each table without counting it. -1 (never analysed) reads as 0.
ESTIMATED_ROWS = """
SELECT c.relname, greatest(c.reltuples, 0)::bigint FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'
  AND c.relname = ANY(%(tables)s)
"""
ESTIMATED_TABLES = [
    "executions",
    "steps",
    "attempts",
    "execution_events",
    "outbox",
    "idempotency_keys",
    "resumes",
]
# The work a worker pool exists for, by workflow, for autoscalers (docs/howto/autoscaling.md):
# steps ready for an executor and steps running on one. Each state reads at most
# WORK_DEPTH_CAP entries of its partial index (steps_ready, steps_running), each joined to
# its execution by primary key, so a scrape stays bounded however deep the backlog; past
# the cap the per-workflow figures stop growing and the exact totals are flowforge_steps'.
WORK_DEPTH_CAP = 10_000
WORK_DEPTH = f"""
SELECT w.key, s.status, count(*) FROM (
    (SELECT execution_id, status FROM steps WHERE status = 'ready' LIMIT {WORK_DEPTH_CAP})
    UNION ALL
    (SELECT execution_id, status FROM steps WHERE status = 'running' LIMIT {WORK_DEPTH_CAP})
) s
JOIN executions e ON e.id = s.execution_id
JOIN workflows w ON w.id = e.workflow_id
GROUP BY w.key, s.status ORDER BY w.key, s.status
"""
WORK_STATES = ("ready", "running")
# Every gauge query, for the plan test.
GAUGE_QUERIES = {
    "needing_attention": attention.COUNT_NEEDING_OPERATOR,
    "live_executions": LIVE_EXECUTIONS,
    "live_steps": LIVE_STEPS,
    "oldest_ready": OLDEST_READY,
    "open_waits": OPEN_WAITS,
    "expired_leases": EXPIRED_LEASES,
    "slot_gauges": flowcontrol.SLOT_GAUGES,
    "estimated_rows": ESTIMATED_ROWS,
    "outbox_backlog": OUTBOX_BACKLOG,
    "work_depth": WORK_DEPTH,
    "outbound": OUTBOUND_GAUGES,
}


# The families DatabaseGauges yields (the alert rules' test reads them here).
DATABASE_GAUGES = (
    "flowforge_executions",
    "flowforge_executions_needing_attention",
    "flowforge_steps",
    "flowforge_oldest_ready_step_seconds",
    "flowforge_outbox_backlog",
    "flowforge_outbox_oldest_seconds",
    "flowforge_expired_leases",
    "flowforge_waits_open",
    "flowforge_slot_queue",
    "flowforge_slot_holders",
    "flowforge_table_rows_estimate",
    "flowforge_work_depth",
    "flowforge_circuits_open",
    "flowforge_steps_waiting_on_limits",
)


class DatabaseGauges(Collector):
    """Cluster-wide gauges, read from PostgreSQL when scraped: every API process reports
    the same truth."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def collect(self) -> Iterable[Metric]:
        conn = self.conn
        executions = GaugeMetricFamily(
            "flowforge_executions", "Live executions by status.", labels=["status"]
        )
        counts = dict.fromkeys(LIVE_EXECUTION_STATUSES, 0) | dict(
            conn.execute(LIVE_EXECUTIONS).fetchall()
        )
        for status, count in counts.items():
            executions.add_metric([status], count)
        steps = GaugeMetricFamily("flowforge_steps", "Live steps by status.", labels=["status"])
        counts = dict.fromkeys(LIVE_STEP_STATUSES, 0) | dict(conn.execute(LIVE_STEPS).fetchall())
        for status, count in counts.items():
            steps.add_metric([status], count)
        (needing,) = one(conn.execute(attention.COUNT_NEEDING_OPERATOR))
        (oldest,) = one(conn.execute(OLDEST_READY))
        backlog, age = one(conn.execute(OUTBOX_BACKLOG))
        (expired,) = one(conn.execute(EXPIRED_LEASES))
        (open_waits,) = one(conn.execute(OPEN_WAITS))
        circuits_open, waiting_on_limits = one(conn.execute(OUTBOUND_GAUGES))
        queue = GaugeMetricFamily(
            "flowforge_slot_queue",
            "Executions queued for a concurrency slot, by workflow.",
            labels=["workflow"],
        )
        holders = GaugeMetricFamily(
            "flowforge_slot_holders",
            "Executions holding a concurrency slot, by workflow.",
            labels=["workflow"],
        )
        for key, queued, held in conn.execute(flowcontrol.SLOT_GAUGES).fetchall():
            queue.add_metric([key], queued)
            holders.add_metric([key], held)
        rows = GaugeMetricFamily(
            "flowforge_table_rows_estimate",
            "Rows per table, as the planner estimates them (pg_class.reltuples).",
            labels=["table"],
        )
        estimates = dict.fromkeys(ESTIMATED_TABLES, 0) | dict(
            conn.execute(ESTIMATED_ROWS, {"tables": ESTIMATED_TABLES}).fetchall()
        )
        for table, estimate in estimates.items():
            rows.add_metric([table], estimate)
        depth = GaugeMetricFamily(
            "flowforge_work_depth",
            "Steps ready for a worker and running on one, by workflow (the autoscaling "
            f"signal; each state counts at most {WORK_DEPTH_CAP} steps).",
            labels=["workflow", "state"],
        )
        for workflow, state, count in conn.execute(WORK_DEPTH).fetchall():
            depth.add_metric([workflow, state], count)
        yield executions
        yield GaugeMetricFamily(
            "flowforge_executions_needing_attention",
            "Executions an operator must act on: every one with an unknown step, whatever its "
            "status (cancelled ones included), and every one in status needs_attention.",
            value=needing,
        )
        yield steps
        yield GaugeMetricFamily(
            "flowforge_oldest_ready_step_seconds",
            "Age of the oldest ready step (since its wake-up was last sent); 0 when none.",
            value=float(oldest),
        )
        yield GaugeMetricFamily(
            "flowforge_outbox_backlog",
            "Wake-ups not yet confirmed by RabbitMQ.",
            value=backlog,
        )
        yield GaugeMetricFamily(
            "flowforge_outbox_oldest_seconds",
            "Age of the oldest unpublished wake-up; 0 when none.",
            value=float(age),
        )
        yield GaugeMetricFamily(
            "flowforge_expired_leases",
            "Running steps whose lease ran out (the reaper's work to do).",
            value=expired,
        )
        yield GaugeMetricFamily(
            "flowforge_waits_open",
            "Wait steps waiting for a resume or their timeout.",
            value=open_waits,
        )
        yield GaugeMetricFamily(
            "flowforge_circuits_open",
            "Outbound limit keys whose circuit is open or half-open (SPEC §13).",
            value=circuits_open,
        )
        yield GaugeMetricFamily(
            "flowforge_steps_waiting_on_limits",
            "Ready steps waiting for an outbound limit: rate, concurrency, hold or circuit.",
            value=waiting_on_limits,
        )
        yield queue
        yield holders
        yield rows
        yield depth


def render(conn: psycopg.Connection) -> bytes:
    """The API's metrics page: the counters of every gunicorn worker of this server summed
    (multiprocess mode), or of this process alone, and the database gauges."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get(MULTIPROC_ENV):
        MultiProcessCollector(registry)
    else:
        registry.register(REGISTRY)
    registry.register(DatabaseGauges(conn))
    return generate_latest(registry)
