"""One bench run's world: private database and vhost, bin/api, bin/worker, workflows.

The session owns an ExitStack; everything is registered on it as soon as it exists,
so leaving the `with` block — normally, by Ctrl-C, SIGTERM or an error — stops the
processes, drops the database and deletes the vhost.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pika
import psycopg
import requests

from flowforge.store import apikeys
from flowforge.store.migrate import migrate
from tests.bench.infra import (
    BenchError,
    Child,
    OwnPostgres,
    PrivateDatabase,
    PrivateVhost,
    _die_with_parent,
    interrupt,
    rss_mb,
)
from tests.bench.load import wait_http
from tests.support.definitions import http, transform, workflow
from tests.support.processes import WORKER, api_argv, free_port

PREFIX = "bench"

CHAIN3 = workflow(
    transform("a", {"order": "{{ input.order_id }}"}),
    transform("b", {"order": "{{ a.order }}", "total": "{{ input.total }}"}, after=("a",)),
    transform("c", {"done": "{{ b.order }}", "total": "{{ b.total }}"}, after=("b",)),
    name="Three transforms",
)


def fan_definition(stub_url: str) -> dict[str, Any]:
    """GET a local stub, then two parallel transforms, then a join."""
    joined = {"price": "{{ left.price }}", "total": "{{ right.total }}"}
    return workflow(
        http("fetch", "GET", f"{stub_url}/items/{{{{ input.order_id }}}}"),
        transform("left", {"price": "{{ fetch.body.price }}"}, after=("fetch",)),
        transform("right", {"total": "{{ input.total }}"}, after=("fetch",)),
        transform("join", joined, after=("left", "right")),
        name="Fetch, fan out, join",
    )


# The sleepers' workflow: one long delay. Its rows are bulk-inserted by SQL.
SLEEPER = workflow({"id": "sleep", "type": "delay", "duration_s": 2592000}, name="Sleeper")


# Signs the bench's resume URLs (32 bytes, base64url); the bench derives tokens with it.
RESUME_KEY = "YmVuY2gtb25seS1yZXN1bWUta2V5LTMyLWJ5dGVzISE"


@dataclass
class Workflow:
    """A published workflow the bench drives."""

    key: str
    workflow_id: int
    version_id: int


class Interrupted(BaseException):
    """SIGTERM/SIGHUP, turned into an exception so the ExitStack still cleans up."""


class Session:
    """The bench's private world; use as a context manager."""

    def __init__(
        self,
        admin_url: str,
        api_workers: int,
        worker_concurrency: int,
        keep_logs: bool,
        profile_dir: Path | None,
        own_postgres: bool = False,
    ) -> None:
        self.admin_url = admin_url
        self.own_postgres = own_postgres
        self.own_postgres_settings: dict[str, str] = {}
        self.own_server: OwnPostgres | None = None
        self.api_workers = api_workers
        self.worker_concurrency = worker_concurrency
        self.keep_logs = keep_logs
        self.profile_dir = profile_dir
        self.stack = contextlib.ExitStack()
        self.log_dir = Path(tempfile.mkdtemp(prefix="ff-bench-"))
        self.api: Child | None = None
        self.api_url = ""
        self.worker: Child | None = None
        self._workers_started = 0
        self.workflows: dict[str, Workflow] = {}
        self.sleepers = 0
        self.failed = False
        # Whether other backends may still hold unreported commit counts (see figures).
        self.stats_dirty = True
        # Set for every child started from now on (the tracing phase's OTEL_* variables).
        self.extra_env: dict[str, str] = {}

    @classmethod
    def from_args(cls, args: Any) -> Session:
        """The session bin/bench's command line asks for (both phases use it)."""
        return cls(
            args.admin_url,
            args.api_workers,
            args.worker_concurrency,
            args.keep_logs,
            args.profile,
            own_postgres=args.own_postgres,
        )

    # ---- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> Session:
        self.stack.__enter__()
        self._trap_signals()
        try:
            self._open()
        except BaseException:
            self.failed = True
            self.stack.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.failed = self.failed or exc_type is not None
        # Cleanup itself must not be cut short by a second Ctrl-C.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.stack.__exit__(exc_type, exc, tb)
        finally:
            signal.signal(signal.SIGINT, previous)
        if self.failed or self.keep_logs:
            print(f"bench: logs kept in {self.log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def _trap_signals(self) -> None:
        def interrupt(signum: int, _frame: FrameType | None) -> None:
            raise Interrupted(signal.Signals(signum).name)

        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous = signal.signal(signum, interrupt)
            self.stack.callback(signal.signal, signum, previous)

    def _open(self) -> None:
        if self.own_postgres:
            server = OwnPostgres(self.admin_url, self.log_dir)
            self.stack.callback(self._quietly, "stop own PostgreSQL", server.stop)
            self.admin_url = server.url
            self.own_postgres_settings = server.settings
            self.own_server = server
        self.db = PrivateDatabase.create(self.admin_url)
        self.stack.callback(self._quietly, "drop database", self.db.drop)
        migrate(self.db.url)
        self.vhost = PrivateVhost.create()
        self.stack.callback(self._quietly, "delete vhost", self.vhost.delete)
        self.vhost.grant()
        self.conn = psycopg.connect(self.db.url, autocommit=True)
        self.stack.callback(self.conn.close)
        self.api_key = apikeys.create(self.conn, "bench")[1]

    def _quietly(self, what: str, action: Any) -> None:
        try:
            action()
        except Exception as exc:
            print(f"bench: cleanup step '{what}' failed: {exc}", file=sys.stderr)

    # ---- processes -------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        """Child environment: FlowForge's defaults, plus this run's services and loopback."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")}
        return {
            **base,
            "FLOWFORGE_DATABASE_URL": self.db.url,
            "FLOWFORGE_AMQP_URL": self.vhost.url,
            "FLOWFORGE_AMQP_PREFIX": PREFIX,
            "FLOWFORGE_HTTP_ALLOW": "127.0.0.1",
            "FLOWFORGE_WORKER_CONCURRENCY": str(self.worker_concurrency),
            # Resume URLs of wait steps (tests/bench/resume_latency.py): the worker renders
            # them against the API this session started.
            "FLOWFORGE_RESUME_KEY": RESUME_KEY,
            # Throughput is the engine's, not the default per-workflow webhook limit's.
            "FLOWFORGE_WEBHOOK_RATE": "0",
            **({"FLOWFORGE_PUBLIC_URL": self.api_url} if self.api_url else {}),
            **self.extra_env,
            **extra,
        }

    def child(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        """Start a child process that is stopped when the session ends, whatever happens."""
        proc = Child(name, argv, env, self.log_dir)
        self.stack.callback(self._quietly, f"stop {name}", proc.stop)
        return proc

    def start_api(self) -> None:
        port = free_port()
        self.api = self.child("api", api_argv(port, self.api_workers), self.env())
        self.api_url = f"http://127.0.0.1:{port}"
        api = self.api
        wait_http(f"{self.api_url}/healthz", api.alive, "bin/api")

    def start_worker(self) -> Child:
        self._workers_started += 1
        self.stats_dirty = True
        worker = self.child(f"worker-{self._workers_started}", WORKER, self.env())
        deadline = time.monotonic() + 60
        while '"consuming"' not in worker.log_text():
            if not worker.alive():
                raise BenchError(f"bin/worker exited during start-up:\n{worker.tail()}")
            if time.monotonic() > deadline:
                raise BenchError(f"bin/worker did not start consuming:\n{worker.tail()}")
            time.sleep(0.1)
        self.worker = worker
        return worker

    def stop_worker(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None

    # ---- workflows and data ----------------------------------------------------------

    def publish(self, key: str, definition: dict[str, Any]) -> Workflow:
        """Publish through the real API, like a user would."""
        r = requests.post(
            f"{self.api_url}/api/v1/workflows/{key}/versions",
            json=definition,
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=30,
        )
        if r.status_code != 201:
            raise BenchError(f"publishing {key} failed: {r.status_code} {r.text[:500]}")
        row = self.conn.execute(
            "SELECT w.id, v.id FROM workflows w JOIN workflow_versions v "
            "ON v.workflow_id = w.id AND v.version = w.latest_version WHERE w.key = %s",
            (key,),
        ).fetchone()
        workflow = Workflow(key, row[0], row[1])
        self.workflows[key] = workflow
        return workflow

    def hook_url(self, key: str) -> str:
        return f"{self.api_url}/hooks/{key}"

    def settle(self, outbox: bool = True, quiet_s: float = 0.5, timeout_s: float = 30.0) -> int:
        """Wait until no new executions (and outbox rows) appear; returns the queries made.

        When wrk stops, requests it gave up on may still sit in gunicorn's listen
        backlog; the API serves them afterwards, and they must not land in the next
        measurement.
        """
        # Every webhook the bench sends carries an Idempotency-Key: counting keys is
        # counting new executions, without scanning a million bulk-loaded sleepers.
        probe = "SELECT count(*), 0 FROM idempotency_keys"
        if outbox:
            probe = "SELECT (SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM outbox)"
        last = self.conn.execute(probe).fetchone()
        queries = 1
        quiet_since = time.monotonic()
        deadline = quiet_since + timeout_s
        while time.monotonic() - quiet_since < quiet_s and time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.conn.execute(probe).fetchone()
            queries += 1
            if now != last:
                last, quiet_since = now, time.monotonic()
        return queries

    def reset(self) -> None:
        """Empty the runtime tables (keeping bulk-loaded sleepers) and the queue."""
        self.settle()
        with self.conn.transaction():
            self.conn.execute("SET LOCAL lock_timeout = '30s'")
            if self.sleepers:
                others = [w.workflow_id for k, w in self.workflows.items() if k != "sleeper"]
                self.conn.execute("DELETE FROM executions WHERE workflow_id = ANY(%s)", (others,))
                self.conn.execute("TRUNCATE outbox, idempotency_keys")
            else:
                self.conn.execute(
                    # The debounce and batch groups first: the scheduler's claim locks a
                    # group, then its execution; the same order cannot deadlock with it.
                    "TRUNCATE intake_groups, intake_group_events, executions, steps, attempts, "
                    "execution_events, resumes, outbox, idempotency_keys, event_waits, "
                    "event_consumptions, execution_attributes"
                )
        if self.sleepers:
            # The DELETE above leaves dead rows beside the million sleepers; with
            # autovacuum off (as on this machine's server) they would bloat every later
            # phase, which production autovacuum would have cleaned by then.
            self.conn.execute("VACUUM ANALYZE executions, steps, attempts, execution_events")
        self.purge_queue(f"{PREFIX}.steps")
        # Start every repetition from clean buffers, not in the middle of a checkpoint.
        self.conn.execute("CHECKPOINT")

    def purge_queue(self, queue: str) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.vhost.url))
        try:
            channel = connection.channel()
            # Not declared yet: nothing to purge.
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                channel.queue_purge(queue)
        finally:
            with contextlib.suppress(Exception):
                connection.close()

    def queue_depth(self, queue: str) -> int:
        connection = pika.BlockingConnection(pika.URLParameters(self.vhost.url))
        try:
            return connection.channel().queue_declare(queue, passive=True).method.message_count
        finally:
            with contextlib.suppress(Exception):
                connection.close()

    def scalar(self, sql: str, params: Any = None) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return row[0] if row else None

    def xact_commits(self) -> int:
        return int(
            self.scalar(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
        )

    def next_xid(self) -> int:
        """The next transaction id: its delta counts write transactions, without lag."""
        return int(self.scalar("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"))

    def flush_own_stats(self) -> None:
        """Report this connection's counters now instead of up to 10 s later."""
        self.conn.execute("SELECT pg_stat_force_next_flush()")

    def insert_sleepers(self, count: int) -> float:
        """`count` executions, each with one delay sleeping for 30 days; returns seconds.

        Bulk-loaded with FOREIGN KEY triggers off (session_replication_role = replica):
        the rows are valid by construction, and checking a million of them one by one
        would triple the load time without changing what is measured afterwards.
        """
        sleeper = self.workflows["sleeper"]
        self.stats_dirty = True
        started = time.monotonic()
        with self.conn.transaction():
            with (
                contextlib.suppress(psycopg.errors.InsufficientPrivilege),
                self.conn.transaction(),
            ):
                self.conn.execute("SET LOCAL session_replication_role = replica")
            self.conn.execute(
                "CREATE TEMP TABLE sleeper_ids ON COMMIT DROP AS "
                "SELECT gen_random_uuid() AS id FROM generate_series(1, %s) ORDER BY 1",
                (count,),
            )
            self.conn.execute(
                "INSERT INTO executions (id, workflow_id, version_id, status, input, "
                "started_at, created_at) "
                "SELECT id, %s, %s, 'waiting', '{}', now(), now() - interval '1 hour' "
                "FROM sleeper_ids",
                (sleeper.workflow_id, sleeper.version_id),
            )
            self.conn.execute(
                "INSERT INTO steps (execution_id, step_id, type, position, status, wake_at, "
                "started_at) "
                "SELECT id, 'sleep', 'delay', 1, 'waiting', now() + interval '30 days', now() "
                "FROM sleeper_ids"
            )
        # What autovacuum would have done by the time a real backlog is this big.
        self.conn.execute("VACUUM ANALYZE executions")
        self.conn.execute("VACUUM ANALYZE steps")
        self.sleepers = count
        return time.monotonic() - started

    # ---- sampling --------------------------------------------------------------------

    def sample_rss(self, pid: int) -> RssSampler:
        return RssSampler(pid)

    @contextlib.contextmanager
    def statements(self, name: str) -> Iterator[None]:
        """With --profile and pg_stat_statements loaded: this database's statements
        during the block, by total time, into DIR/<name>.statements.txt."""
        if self.profile_dir is None or "pg_stat_statements" not in str(
            self.scalar("SHOW shared_preload_libraries")
        ):
            yield
            return
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        dbid = self.scalar("SELECT oid FROM pg_database WHERE datname = current_database()")
        self.conn.execute("SELECT pg_stat_statements_reset(0::oid, %s::oid, 0::bigint)", (dbid,))
        yield
        rows = self.conn.execute(
            "SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3),"
            " rows, shared_blks_hit, shared_blks_read, wal_records, wal_fpi, wal_bytes,"
            " regexp_replace(query, '\\s+', ' ', 'g')"
            " FROM pg_stat_statements WHERE dbid = %s ORDER BY total_exec_time DESC LIMIT 40",
            (dbid,),
        ).fetchall()
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        with open(self.profile_dir / f"{name}.statements.txt", "w") as out:
            out.write(
                "calls\ttotal_ms\tmean_ms\trows\tblks_hit\tblks_read\twal_records\twal_fpi\twal_bytes\tquery\n"
            )
            for row in rows:
                out.write("\t".join(str(v) for v in row) + "\n")

    def py_spy(
        self, name: str, pid: int, subprocesses: bool = False
    ) -> contextlib.AbstractContextManager:
        """Record a py-spy profile of `pid` while the block runs (only with --profile)."""
        return _PySpy(self.profile_dir, name, pid, subprocesses)


class RssSampler:
    """The peak VmRSS of one process while the block runs, sampled every 100 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_mb = rss_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak_mb = max(self.peak_mb, rss_mb(self.pid))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class _PySpy:
    """py-spy record --nonblocking on a process, stopped with SIGINT at block end."""

    def __init__(self, out_dir: Path | None, name: str, pid: int, subprocesses: bool) -> None:
        self.out_dir = out_dir
        self.name = name
        self.pid = pid
        self.subprocesses = subprocesses
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> _PySpy:
        if self.out_dir is None:
            return self
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(exe).exists():
            raise BenchError("--profile needs py-spy: .venv/bin/pip install py-spy")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            exe,
            "record",
            "--nonblocking",
            "--rate",
            "200",
            "--format",
            "raw",
            "--pid",
            str(self.pid),
            "-o",
            str(self.out_dir / f"{self.name}.txt"),
        ]
        if self.subprocesses:
            argv.append("--subprocesses")
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        time.sleep(0.5)  # let it attach before the load starts
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        interrupt(self.proc, 30)
