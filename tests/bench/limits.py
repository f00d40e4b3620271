"""The machine's own limits, measured in the same run as FlowForge.

- pg_tx_per_s: pgbench running the webhook-shaped transaction (an execution row and
  its outbox row, committed together) at the API's concurrency;
- bare_flask_per_s: the same transaction behind a bare Flask endpoint under bin/api's
  gunicorn command line (tests/bench/bare_app.py), loaded with the same wrk script;
  measured in pairs with FlowForge's webhook (see bench.py);
- amqp_confirm_each_per_s / amqp_batched_per_s: raw pika, the relay's message shape,
  persistent and mandatory, confirming each message vs. one wait for the publisher
  confirms of each batch (broker.Confirms, the relay's way).
"""

from __future__ import annotations

import re
import shutil
import sys
import time
import uuid
from typing import Any

import pika

from flowforge.worker.broker import ROUTING_KEY, Confirms, Topology, Wakeup
from flowforge.worker.relay import BATCH as RELAY_BATCH
from tests.bench.infra import BenchError, CpuWindow, run_tool
from tests.bench.load import wait_http, wrk
from tests.bench.session import Session
from tests.support.processes import free_port

# The pgbench script: two inserts into FlowForge's own tables and a commit.
PGBENCH_SCRIPT = "\n".join(
    [
        "BEGIN;",
        "INSERT INTO executions (id, workflow_id, version_id, status, input) "
        "VALUES (gen_random_uuid(), :workflow_id, :version_id, 'queued', "
        '\'{"order_id": "A-1001", "total": 250, "customer": {"id": 42, "tier": "gold"}}\') '
        "RETURNING id AS eid \\gset",
        "INSERT INTO outbox (execution_id, step_id) VALUES (:eid, 'a');",
        "END;",
        "",
    ]
)
TPS = re.compile(r"tps = ([0-9.]+) \(without initial connection time\)")


def pg_tx_per_s(session: Session, clients: int, duration_s: float) -> float:
    """pgbench -M prepared (psycopg prepares repeated statements too) at `clients`."""
    if not shutil.which("pgbench"):
        raise BenchError("pgbench not found: it ships with the postgresql package")
    workflow = session.workflows["chain3"]
    script = session.log_dir / "webhook_tx.sql"
    script.write_text(PGBENCH_SCRIPT)
    session.reset()
    done = run_tool(
        [
            "pgbench",
            "-n",
            "-M",
            "prepared",
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-T",
            str(int(duration_s)),
            "-D",
            f"workflow_id={workflow.workflow_id}",
            "-D",
            f"version_id={workflow.version_id}",
            "-f",
            str(script),
            session.db.url,
        ],
        timeout=duration_s + 120,
    )
    match = TPS.search(done.stdout)
    if done.returncode != 0 or not match:
        raise BenchError(f"pgbench failed: {done.stdout[-800:]}{done.stderr[-800:]}")
    return float(match.group(1))


class BareFlask:
    """The bare endpoint under bin/api's gunicorn settings, kept running so that each
    FlowForge webhook measurement can sit right next to a bare one (the machine may be
    shared: adjacent measurements see the same background load)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.workflow = session.workflows["chain3"]
        port = free_port()
        self.server = session.child(
            "bare-flask",
            [
                sys.executable,
                "-m",
                "tests.bench.bare_serve",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(session.api_workers),
            ],
            session.env(
                BENCH_WORKFLOW_ID=str(self.workflow.workflow_id),
                BENCH_VERSION_ID=str(self.workflow.version_id),
            ),
        )
        self.url = f"http://127.0.0.1:{port}/hooks/{self.workflow.key}"
        wait_http(f"http://127.0.0.1:{port}/", self.server.alive, "bare Flask")

    def per_s(self, connections: int, duration_s: float) -> dict[str, float]:
        """202s per second, driven by the same wrk script as FlowForge's webhook, and
        the machine CPU per request without other users of the machine."""
        self.session.reset()
        self.session.stats_dirty = True
        wrk(self.url, connections, 1, f"bare-warm-{uuid.uuid4().hex[:6]}")
        with CpuWindow({"api": self.server.pid}) as cpu:
            result = wrk(self.url, connections, duration_s, f"bare-{uuid.uuid4().hex[:6]}")
        if result.accepted == 0:
            raise BenchError(f"bare Flask accepted nothing:\n{self.server.tail()}")
        return {"per_s": result.accepted_per_s, "cpu_ms_own": cpu.own_ms / result.accepted}

    def stop(self) -> None:
        self.server.stop()


def _channel(session: Session) -> tuple[pika.BlockingConnection, Any, Topology]:
    connection = pika.BlockingConnection(pika.URLParameters(session.vhost.url))
    channel = connection.channel()
    topology = Topology(f"limit-{uuid.uuid4().hex[:6]}")
    topology.declare(channel)
    return connection, channel, topology


def _publish(channel: Any, topology: Topology, i: int) -> None:
    """One message exactly as the relay publishes a wake-up."""
    channel.basic_publish(
        topology.exchange,
        ROUTING_KEY,
        Wakeup(str(uuid.uuid4()), "a").encode(),
        pika.BasicProperties(
            delivery_mode=pika.DeliveryMode.Persistent,
            content_type="application/json",
            message_id=str(i),
        ),
        mandatory=True,
    )


class _Batched:
    """basic_publish through broker.Confirms, as the relay publishes a batch."""

    def __init__(self, connection: pika.BlockingConnection, channel: Any) -> None:
        self.confirms = Confirms(connection, channel)

    def basic_publish(self, *args: Any, mandatory: bool) -> None:
        self.confirms.publish(*args, mandatory=mandatory)


def _finish(connection: pika.BlockingConnection, topology: Topology, expected: int) -> None:
    channel = connection.channel()
    depth = channel.queue_declare(topology.queue, passive=True).method.message_count
    channel.queue_delete(topology.queue)
    channel.queue_delete(topology.dead_queue)
    channel.exchange_delete(topology.exchange)
    channel.exchange_delete(topology.dead_exchange)
    connection.close()
    if depth != expected:
        raise BenchError(f"broker holds {depth} messages, expected {expected}")


def amqp_confirm_each_per_s(session: Session, count: int) -> float:
    """Publisher confirms, waiting for each one (BlockingChannel in confirm mode)."""
    connection, channel, topology = _channel(session)
    channel.confirm_delivery()
    started = time.monotonic()
    for i in range(count):
        _publish(channel, topology, i)
    elapsed = time.monotonic() - started
    _finish(connection, topology, count)
    return count / elapsed


def amqp_batched_per_s(session: Session, count: int, batch: int = RELAY_BATCH) -> float:
    """One wait for the publisher confirms of each `batch` messages, the relay's way of
    confirming (broker.Confirms)."""
    connection, channel, topology = _channel(session)
    batched = _Batched(connection, channel)
    started = time.monotonic()
    for i in range(count):
        _publish(batched, topology, i)
        if (i + 1) % batch == 0 and batched.confirms.wait():
            raise BenchError("the broker refused messages")
    if batched.confirms.wait():
        raise BenchError("the broker refused messages")
    elapsed = time.monotonic() - started
    _finish(connection, topology, count)
    return count / elapsed
