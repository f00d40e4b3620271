"""What the fault tests share: the operator CLI, the broker as a test sees it, the
database as a test sees it, process statistics and signed webhooks. Whole-server outages
use servers of the test's own: tests/support/own_servers.py."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pika
import psycopg
import requests

# The definition builders live in tests/support/definitions.py; re-exported for the fault
# tests that import them from here.
from tests.support.definitions import http as http
from tests.support.definitions import workflow as workflow
from tests.support.processes import Process, wait_for
from tests.support.webhooks import sign

FLOWFORGE = str(Path(sys.executable).parent / "flowforge")
# The `workers` fixture: workers(**extra_env) starts a real bin/worker.
StartWorker = Callable[..., Process]


# ---- the operator CLI ----------------------------------------------------------------


def cli(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run `flowforge ARGS` as an operator would, against the test's database."""
    return subprocess.run(
        [FLOWFORGE, *args], env=dict(env), capture_output=True, text=True, timeout=60
    )


# ---- logs ----------------------------------------------------------------------------


def log_records(proc: Process) -> list[dict[str, Any]]:
    """The JSON-lines records a worker wrote (other lines, e.g. tracebacks, skipped)."""
    records = []
    for line in proc.log().splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


def logged(proc: Process, message: str) -> list[dict[str, Any]]:
    """Records whose message contains `message`."""
    return [r for r in log_records(proc) if message in str(r.get("msg", ""))]


def wait_logged(proc: Process, message: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Poll the process log until a record with `message` shows up."""
    return wait_for(
        lambda: logged(proc, message), timeout=timeout, interval=0.1, message=repr(message)
    )


# ---- RabbitMQ, as the test sees it -------------------------------------------------


@contextlib.contextmanager
def channel(amqp_url: str) -> Iterator[Any]:
    """A short-lived pika channel for the test's own broker operations."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        yield connection.channel()
    finally:
        with contextlib.suppress(Exception):
            connection.close()


def queue_depth(amqp_url: str, queue: str) -> int:
    """Messages ready in a queue (not counting deliveries a consumer holds unacked)."""
    with channel(amqp_url) as ch:
        return ch.queue_declare(queue, passive=True).method.message_count


def publish_raw(amqp_url: str, exchange: str, body: bytes, routing_key: str = "step") -> None:
    """Publish bytes the way the relay does (persistent, mandatory), confirmed."""
    with channel(amqp_url) as ch:
        ch.confirm_delivery()
        ch.basic_publish(
            exchange,
            routing_key,
            body,
            pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent),
            mandatory=True,
        )


def publish_wakeup(amqp_url: str, prefix: str, execution_id: str, step_id: str) -> None:
    """A wake-up as FlowForge's relay would publish it."""
    body = json.dumps({"execution_id": execution_id, "step_id": step_id}).encode()
    publish_raw(amqp_url, prefix, body)


# ---- PostgreSQL ------------------------------------------------------------------------


def terminate_backends(db: psycopg.Connection) -> int:
    """Kill every other session on the test database (API, worker pools, listeners)."""
    rows = db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    return len(rows)


def rows(db: psycopg.Connection, sql: str, params: Mapping[str, Any] | None = None) -> list[Any]:
    """All rows of a query, for short assertions."""
    return db.execute(sql, params or {}).fetchall()


def scalar(db: psycopg.Connection, sql: str, params: Mapping[str, Any] | None = None) -> Any:
    """The single value of a query."""
    row = db.execute(sql, params or {}).fetchone()
    assert row is not None
    return row[0]


def step_status(db: psycopg.Connection, execution_id: str, step_id: str) -> str:
    """The status of one step's row, as the database holds it now."""
    return str(
        scalar(
            db,
            "SELECT status FROM steps WHERE execution_id = %(e)s AND step_id = %(s)s",
            {"e": execution_id, "s": step_id},
        )
    )


def succeeded_twice(db: psycopg.Connection) -> list[Any]:
    """Steps with more than one succeeded attempt: the duplicate FlowForge must never make."""
    return rows(
        db,
        "SELECT execution_id, step_id, count(*) FROM attempts WHERE outcome = 'succeeded' "
        "GROUP BY 1, 2 HAVING count(*) > 1",
    )


# ---- processes ---------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """Threads and resident memory (kB) of a live process, from /proc/PID/status."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in {"Threads", "VmRSS"}:
            found[name] = int(value.split()[0])
    return found


# ---- signed webhooks ---------------------------------------------------------------


def signed_headers(secret: str, msg_id: str, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers for `body`, signed now."""
    timestamp = int(time.time())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def is_problem(response: requests.Response, status: int) -> bool:
    """An RFC 9457 answer with this status and no stack trace in it."""
    if response.status_code != status:
        return False
    if not response.headers.get("Content-Type", "").startswith("application/problem+json"):
        return False
    body = response.json()
    return body.get("status") == status and "Traceback" not in response.text
