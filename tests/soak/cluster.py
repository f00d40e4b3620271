"""The system under test: a private database and broker prefix, two bin/api processes, and
worker slots — each worker reaching PostgreSQL and RabbitMQ through its own fault proxies,
so the nemesis can cut or blackhole one worker's links without touching the shared
services or any other process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pika
import psycopg

from flowforge.store import apikeys
from flowforge.store.migrate import migrate
from tests.support.faultproxy import FaultProxy
from tests.support.processes import (
    ROOT,
    TEST_ENCRYPTION_KEY,
    TEST_RESUME_KEY,
    Process,
    start_api,
)

API_PROCESSES = 2
API_WORKERS_EACH = 2
STOP_TIMEOUT_S = 5.0


@dataclass
class WorkerSlot:
    """One worker position: its proxies live for the whole run, its process is replaced
    after every SIGKILL (a new generation, a new FLOWFORGE_WORKER_ID and a new log)."""

    index: int
    pg: FaultProxy
    amqp: FaultProxy
    generation: int = 0
    proc: Process | None = None
    paused: bool = False
    retired: list[Process] = field(default_factory=list)

    @property
    def worker_id(self) -> str:
        return f"soak-w{self.index}.{self.generation}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.popen.poll() is None

    def signal_group(self, signum: int) -> None:
        if self.alive:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)


class Cluster:
    """Creates, faults and tears down everything one run needs."""

    def __init__(
        self,
        admin_url: str,
        amqp_url: str,
        logs: Path,
        *,
        workers: int,
        lease_s: float,
        reconcile_s: float,
        concurrency: int,
        proxied: bool = True,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.admin_url = admin_url
        # Without proxies (servers mode ha) workers reach the servers directly.
        self.proxied = proxied
        self.extra_env = dict(extra_env or {})
        self.amqp_url = amqp_url
        self.logs = logs
        self.lease_s = lease_s
        self.reconcile_s = reconcile_s
        self.concurrency = concurrency
        suffix = uuid.uuid4().hex[:10]
        self.database = f"ff_soak_{suffix}"
        self.prefix = f"ff_soak_{suffix}"
        self.apis: list[Process] = []
        self.api_bases: list[str] = []
        self.api_key = ""
        self.slots: list[WorkerSlot] = []
        self._created_database = False
        server = psycopg.conninfo.conninfo_to_dict(admin_url)
        pg_host = str(server.get("host") or "127.0.0.1").split(",")[0]
        pg_port = int(str(server.get("port") or 5432).split(",")[0])
        for index in range(workers):
            pg = FaultProxy(pg_host, pg_port)
            amqp = FaultProxy.for_url(amqp_url.split(",")[0])
            self.slots.append(WorkerSlot(index, pg=pg, amqp=amqp))

    @property
    def database_url(self) -> str:
        return psycopg.conninfo.make_conninfo(self.admin_url, dbname=self.database)

    def env(self, slot: WorkerSlot | None = None) -> dict[str, str]:
        """The processes' environment; a worker's URLs point at its own proxies."""
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")},
            "FLOWFORGE_DATABASE_URL": self.database_url,
            "FLOWFORGE_AMQP_URL": self.amqp_url,
            "FLOWFORGE_AMQP_PREFIX": self.prefix,
            "FLOWFORGE_LEASE_SECONDS": str(self.lease_s),
            "FLOWFORGE_RECONCILE_SECONDS": str(self.reconcile_s),
            "FLOWFORGE_HTTP_ALLOW": "127.0.0.1",
            "FLOWFORGE_WORKER_CONCURRENCY": str(self.concurrency),
            "FLOWFORGE_LOG_LEVEL": "INFO",
            # A worker stuck in its drain is sent SIGABRT (see drain): its log then ends
            # with every thread's stack.
            "PYTHONFAULTHANDLER": "1",
            # Resume URLs (wait steps) need a base; the run swaps in a real API's.
            "FLOWFORGE_PUBLIC_URL": "http://127.0.0.1:9",
            "FLOWFORGE_RESUME_KEY": TEST_RESUME_KEY,
            "FLOWFORGE_ENCRYPTION_KEY": TEST_ENCRYPTION_KEY,
            **self.extra_env,
        }
        if slot is not None and not self.proxied:
            env["FLOWFORGE_WORKER_ID"] = slot.worker_id
        elif slot is not None:
            env["FLOWFORGE_DATABASE_URL"] = psycopg.conninfo.make_conninfo(
                self.database_url, host="127.0.0.1", port=slot.pg.port
            )
            env["FLOWFORGE_AMQP_URL"] = slot.amqp.url(self.amqp_url)
            env["FLOWFORGE_WORKER_ID"] = slot.worker_id
        return env

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Database, API key, two APIs, every worker consuming."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        self._created_database = True
        migrate(self.database_url)
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            self.api_key = apikeys.create(conn, "soak")[1]
        for index in range(API_PROCESSES):
            proc, base = start_api(
                self.env(), self.logs / f"api-{index}.log", workers=API_WORKERS_EACH
            )
            self.apis.append(proc)
            self.api_bases.append(base)
        for slot in self.slots:
            self.spawn(slot)
        for slot in self.slots:
            if self.wait_healthy(slot, timeout=30) is not None:
                assert slot.proc is not None
                raise RuntimeError(f"{slot.worker_id} did not start:\n{slot.proc.log()[-3000:]}")

    def spawn(
        self, slot: WorkerSlot, faults: str = "", extra_env: dict[str, str] | None = None
    ) -> None:
        """Start the slot's next generation without waiting for it (the nemesis must not
        block on a worker whose proxies it is blackholing); `faults` arms fault points
        (FLOWFORGE_FAULTS, see flowforge/faults.py); `extra_env` is for this generation
        only (a skewed clock, tests/soak/pressure.py)."""
        if slot.proc is not None:
            slot.retired.append(slot.proc)
        slot.generation += 1
        slot.paused = False
        log = self.logs / f"worker-{slot.index}.{slot.generation}.log"
        env = {**self.env(slot), "FLOWFORGE_FAULTS": faults, **(extra_env or {})}
        slot.proc = Process([sys.executable, str(ROOT / "bin" / "worker")], env, log)

    def unhealthy(self, slot: WorkerSlot) -> str | None:
        """Why the worker is not fully back (None when it is): alive, consuming, holding
        connections through both of its proxies, and given up on every stranded broker
        connection (a worker notices those by its own heartbeats)."""
        if not slot.alive:
            return "not running"
        if slot.paused:
            return "stopped"
        assert slot.proc is not None
        if '"consuming"' not in slot.proc.log():
            return "never logged consuming"
        if not self.proxied:
            return None
        if slot.pg.open_links == 0:
            return "no database connection"
        if slot.amqp.open_links == 0:
            return "no broker connection"
        if slot.amqp.stranded_links:
            return f"still holds {slot.amqp.stranded_links} stranded broker connection(s)"
        return None

    def wait_healthy(self, slot: WorkerSlot, timeout: float) -> str | None:
        """Wait until the worker is fully back; why it is not, when `timeout` passed."""
        deadline = time.monotonic() + timeout
        while (reason := self.unhealthy(slot)) is not None and slot.alive:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return reason

    def heal(self, timeout: float) -> dict[str, str]:
        """The quiet period begins: every proxy passes, every worker runs and consumes.
        Returns the workers that were not fully back within `timeout`, and why."""
        for slot in self.slots:
            slot.pg.restore()
            slot.amqp.restore()
            if slot.alive:
                slot.signal_group(signal.SIGCONT)
                slot.paused = False
            else:
                self.spawn(slot)
        deadline = time.monotonic() + timeout
        unhealthy = {}
        for slot in self.slots:
            reason = self.wait_healthy(slot, max(deadline - time.monotonic(), 0.5))
            if reason is not None:
                unhealthy[slot.worker_id] = reason
        return unhealthy

    def drain(self, timeout: float) -> dict[str, int | None]:
        """SIGTERM every live worker at once; each one's exit status, None when it was
        still draining after `timeout` (it is sent SIGABRT then, so its log ends with the
        stack of every thread, and SIGKILLed)."""
        live = [slot for slot in self.slots if slot.alive]
        for slot in live:
            slot.signal_group(signal.SIGCONT)
            slot.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes: dict[str, int | None] = {}
        for slot in live:
            assert slot.proc is not None
            try:
                codes[slot.worker_id] = slot.proc.popen.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                codes[slot.worker_id] = None
                slot.proc.signal(signal.SIGABRT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    slot.proc.popen.wait(STOP_TIMEOUT_S)
                slot.proc.kill()
        return codes

    def live_worker_ids(self) -> set[str]:
        return {slot.worker_id for slot in self.slots if slot.alive}

    def close(self) -> None:
        """Stop every process, close the proxies, drop the database and the queues — also
        after a failed or interrupted run."""
        for slot in self.slots:
            for proc in [*slot.retired, *([slot.proc] if slot.proc else [])]:
                with contextlib.suppress(Exception):
                    proc.stop(timeout=STOP_TIMEOUT_S)
            slot.pg.close()
            slot.amqp.close()
        for proc in self.apis:
            with contextlib.suppress(Exception):
                proc.stop(timeout=STOP_TIMEOUT_S)
        if self._created_database:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        with contextlib.suppress(Exception):
            connection = pika.BlockingConnection(pika.URLParameters(self.amqp_url.split(",")[0]))
            channel = connection.channel()
            for queue in (f"{self.prefix}.steps", f"{self.prefix}.dead"):
                channel.queue_delete(queue)
            for exchange in (self.prefix, f"{self.prefix}.dlx"):
                channel.exchange_delete(exchange)
            connection.close()
