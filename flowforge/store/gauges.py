"""The gauges the API reads from PostgreSQL at scrape time, and the API's metrics page.

One cheap query each: live rows through the partial indexes on live statuses, table sizes
from the planner's estimate; none scans a whole table (tests/integration/test_metrics.py
EXPLAINs each one). They live with the store, beside the tables they read; the series
each process counts are flowforge/observe/metrics.py's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psycopg
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from flowforge.domain.model import LIVE_EXECUTION, LIVE_EXECUTION_SQL
from flowforge.launcher import METRICS_DIR_ENV
from flowforge.store import attention, flowcontrol
from flowforge.store.db import one

# ---- gauges read from PostgreSQL ---------------------------------------------------------
# Live executions by status, through executions_by_status (status, id): the count reads
# the live rows' index entries only, however many finished ones the table holds.
LIVE_EXECUTIONS = f"""
SELECT status, count(*) FROM executions
WHERE status IN {LIVE_EXECUTION_SQL}
GROUP BY status
"""
LIVE_EXECUTION_STATUSES = [s.value for s in LIVE_EXECUTION]
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
# A step that waits for an outbound limit (docs/contract.md#outbound-limits) is not stuck: it has a
# wake time.
OLDEST_READY = """
SELECT coalesce(extract(epoch FROM now() - min(ready_at)), 0) FROM steps s
WHERE status = 'ready'
  AND NOT EXISTS (SELECT 1 FROM limit_waits w WHERE w.execution_id = s.execution_id
                  AND w.step_id = s.step_id AND NOT w.woken)
"""
# Outbound limits (docs/contract.md#outbound-limits): circuits not closed, and steps waiting for a
# limit.
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
        labelled = _labelled_gauges(conn)
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
            "Outbound limit keys whose circuit is open or half-open.",
            value=circuits_open,
        )
        yield GaugeMetricFamily(
            "flowforge_steps_waiting_on_limits",
            "Ready steps waiting for an outbound limit: rate, concurrency, hold or circuit.",
            value=waiting_on_limits,
        )
        yield from labelled


def _labelled_gauges(conn: psycopg.Connection) -> list[Metric]:
    """The gauges with a label per workflow or table (slot queues and holders, row
    estimates, work depth), in the order the page shows them."""
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
    return [queue, holders, rows, depth]


def render(conn: psycopg.Connection) -> bytes:
    """The API's metrics page: the counters of every gunicorn worker of this server summed
    (multiprocess mode), or of this process alone, and the database gauges."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get(METRICS_DIR_ENV):
        MultiProcessCollector(registry)
    else:
        registry.register(REGISTRY)
    registry.register(DatabaseGauges(conn))
    return generate_latest(registry)
