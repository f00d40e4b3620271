"""Prometheus gauges read from the database, so every API process reports the same truth."""

from __future__ import annotations

import psycopg

from flowforge import flowcontrol
from flowforge.db import one

EXECUTIONS_BY_STATUS = "SELECT status, count(*) FROM executions GROUP BY status"
# Each count is served by the matching partial index on steps.
LIVE_STEPS = """
SELECT 'ready', count(*) FROM steps WHERE status = 'ready'
UNION ALL SELECT 'running', count(*) FROM steps WHERE status = 'running'
UNION ALL SELECT 'waiting', count(*) FROM steps WHERE status = 'waiting'
"""
OUTBOX_BACKLOG = (
    "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) FROM outbox"
)
# Wait steps waiting for a resume; served by the partial index steps_waiting.
OPEN_WAITS = "SELECT count(*) FROM steps WHERE status = 'waiting' AND type = 'wait'"
EXPIRED_LEASES = "SELECT count(*) FROM steps WHERE status = 'running' AND lease_expires_at < now()"


def render(conn: psycopg.Connection) -> str:
    """The metrics page."""
    lines = [
        "# HELP flowforge_executions Executions by status.",
        "# TYPE flowforge_executions gauge",
    ]
    for status, count in conn.execute(EXECUTIONS_BY_STATUS):
        lines.append(f'flowforge_executions{{status="{status}"}} {count}')
    lines += ["# HELP flowforge_steps Live steps by status.", "# TYPE flowforge_steps gauge"]
    for status, count in conn.execute(LIVE_STEPS):
        lines.append(f'flowforge_steps{{status="{status}"}} {count}')
    backlog, age = one(conn.execute(OUTBOX_BACKLOG))
    (expired,) = one(conn.execute(EXPIRED_LEASES))
    (open_waits,) = one(conn.execute(OPEN_WAITS))
    lines += [
        "# HELP flowforge_outbox_backlog Wake-ups not yet confirmed by RabbitMQ.",
        "# TYPE flowforge_outbox_backlog gauge",
        f"flowforge_outbox_backlog {backlog}",
        "# HELP flowforge_outbox_oldest_seconds Age of the oldest unpublished wake-up.",
        "# TYPE flowforge_outbox_oldest_seconds gauge",
        f"flowforge_outbox_oldest_seconds {float(age):.3f}",
        "# HELP flowforge_expired_leases Running steps whose lease ran out (reaper pending).",
        "# TYPE flowforge_expired_leases gauge",
        f"flowforge_expired_leases {expired}",
        "# HELP flowforge_waits_open Wait steps waiting for a resume or their timeout.",
        "# TYPE flowforge_waits_open gauge",
        f"flowforge_waits_open {open_waits}",
        *flowcontrol.metric_lines(conn),
    ]
    return "\n".join(lines) + "\n"
