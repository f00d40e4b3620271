"""The private resources of one bench run and the machine readings it takes.

Everything the bench creates — a database, a RabbitMQ vhost, child processes — is
registered on a `contextlib.ExitStack` the moment it exists, so Ctrl-C, SIGTERM or an
error anywhere still drops and stops it all. Child processes additionally get
PR_SET_PDEATHSIG: even a SIGKILLed bench does not leave an API or worker behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
ADMIN_DATABASE = "postgresql://postgres@127.0.0.1:5432/postgres"
AMQP_ADDRESS = "127.0.0.1:5672"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: the kernel sends the child SIGTERM when the bench process dies."""
    _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


class BenchError(Exception):
    """Something the bench needs is missing or misbehaved; the message says what."""


class Child:
    """A child process in its own session (so a signal reaches all of gunicorn's
    workers at once), with its output in a log file for post-mortems."""

    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], log_dir: Path
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        """The end of the child's log, for error messages."""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the whole session (graceful drain), SIGKILL what is left after timeout."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        # Gunicorn workers that outlived their master would still sit in the session.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self._log.close()


def interrupt(proc: subprocess.Popen, timeout: float) -> None:
    """SIGINT (postgres' fast shutdown, py-spy's "write the profile"), SIGKILL after timeout."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_tool(argv: Sequence[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """Run a short-lived tool (pgbench, wrk, rabbitmqctl); it dies with the bench."""
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_die_with_parent,
        **kwargs,
    )


# Settings copied from the local server into an --own-postgres cluster, so that both
# measure the same configuration.
COPIED_SETTINGS = (
    "shared_buffers",
    "max_connections",
    "max_wal_size",
    "min_wal_size",
    "checkpoint_timeout",
    "checkpoint_completion_target",
    "wal_level",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "autovacuum",
    "work_mem",
    "effective_cache_size",
)


class OwnPostgres:
    """A throwaway PostgreSQL cluster on a free loopback port, for shared machines where
    other people's fault tests restart the local server in the middle of a run.

    It runs the local server's binaries with the local server's settings (read from it
    when it answers), plus pg_stat_statements for --profile. The postmaster is our child
    (dies with the bench); its data directory is removed at the end.
    """

    def __init__(self, like_url: str, log_dir: Path) -> None:
        self.bindir = _pg_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="ff-bench-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        settings = _local_settings(like_url)
        owner = _postgres_owner()
        if owner is not None:
            os.chown(self.root, owner[0], owner[1])
        initdb = subprocess.run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=_as_user(owner),
        )
        if initdb.returncode != 0:
            raise BenchError(f"initdb failed: {initdb.stderr[-800:]}")
        options = {
            **settings,
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.root),
            "shared_preload_libraries": "pg_stat_statements",
        }
        argv = [str(self.bindir / "postgres"), "-D", str(self.data)]
        for name, value in options.items():
            argv += ["-c", f"{name}={value}"]
        self._log = open(log_dir / "postgres.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_as_user(owner),
        )
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.settings = settings
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise BenchError(
                        f"own PostgreSQL did not start; see {log_dir}/postgres.log"
                    ) from None
                time.sleep(0.2)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then remove the data directory."""
        if self.proc.poll() is None:
            interrupt(self.proc, 60)
        self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _pg_bindir() -> Path:
    """The bin directory of the newest installed PostgreSQL (Debian layout), or pg_config's."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if candidates:
        return candidates[-1].parent
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        return Path(out.stdout.strip())
    except OSError:
        raise BenchError("--own-postgres: no PostgreSQL binaries (initdb) found") from None


def _local_settings(url: str) -> dict[str, str]:
    """The settings that shape performance, as the local server has them."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            return {
                name: conn.execute(f"SELECT current_setting('{name}')").fetchone()[0]
                for name in COPIED_SETTINGS
            }
    except psycopg.Error:
        return {}


def _postgres_owner() -> tuple[int, int] | None:
    """PostgreSQL refuses to run as root: as root, run it as the postgres user."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        raise BenchError("--own-postgres as root needs a 'postgres' user") from None
    return entry.pw_uid, entry.pw_gid


def _as_user(owner: tuple[int, int] | None) -> Any:
    def preexec() -> None:
        _die_with_parent()
        if owner is not None:
            os.setgid(owner[1])
            os.setuid(owner[0])

    return preexec


@dataclass
class PrivateDatabase:
    """A database of its own on the local server, dropped WITH (FORCE) at the end."""

    admin_url: str
    name: str

    @classmethod
    def create(cls, admin_url: str) -> PrivateDatabase:
        name = f"ff_bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return cls(admin_url, name)

    @property
    def url(self) -> str:
        return psycopg.conninfo.make_conninfo(self.admin_url, dbname=self.name)

    def drop(self, patience_s: float = 120.0) -> None:
        """Drop it; on a shared server someone may be restarting PostgreSQL, so wait."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)


def rabbitmqctl(*args: str, patience_s: float = 120.0) -> str:
    """rabbitmqctl, quiet; retried while the broker app is down (on a shared machine a
    fault test may have stopped it for a moment); then a BenchError with its stderr."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            done = run_tool(["rabbitmqctl", "-q", *args], timeout=120)
        except FileNotFoundError:
            raise BenchError("rabbitmqctl not found: the bench needs the local RabbitMQ") from None
        if done.returncode == 0:
            return done.stdout
        if time.monotonic() > deadline:
            first = (done.stderr.strip().splitlines() or [""])[0]
            raise BenchError(f"rabbitmqctl {' '.join(args)} failed: {first[:300]}")
        time.sleep(3)


@dataclass
class PrivateVhost:
    """A RabbitMQ vhost of its own: deleting it removes every queue the run declared."""

    name: str

    @classmethod
    def create(cls) -> PrivateVhost:
        vhost = cls(f"ff_bench_{uuid.uuid4().hex[:10]}")
        rabbitmqctl("add_vhost", vhost.name)
        return vhost

    def grant(self) -> None:
        rabbitmqctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{AMQP_ADDRESS}/{quote(self.name, safe='')}"

    def delete(self) -> None:
        rabbitmqctl("delete_vhost", self.name)


# ---- machine readings -------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What the figures were measured on: they only mean something next to this."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def machine_cpu_ms() -> tuple[float, float]:
    """Busy CPU time of the whole machine so far (all cores), and the part of it spent
    in interrupts and softirqs (loopback networking), which no process is charged for."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    busy = (user + nice + system + irq + softirq + steal) * 1000.0 / CLOCK_TICKS
    return busy, (irq + softirq) * 1000.0 / CLOCK_TICKS


def rss_mb(pid: int) -> float:
    """Resident memory of one process (VmRSS), in MiB; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass(frozen=True)
class ProcessCpu:
    """One process's identity and CPU time at a moment."""

    comm: str
    session: int
    cpu_ms: float


def process_table() -> dict[int, ProcessCpu]:
    """CPU time (user + system) of every process right now, from /proc/PID/stat."""
    table: dict[int, ProcessCpu] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        rest = raw[raw.rindex(")") + 2 :].split()
        ticks = int(rest[11]) + int(rest[12])
        table[int(entry.name)] = ProcessCpu(comm, int(rest[3]), ticks * 1000.0 / CLOCK_TICKS)
    return table


class CpuWindow:
    """Machine CPU over an interval, and who spent it (API, worker, PostgreSQL, ...)."""

    RABBIT = frozenset({"beam.smp", "erl_child_setup", "inet_gethost", "epmd"})

    def __init__(self, sessions: Mapping[str, int]) -> None:
        self.sessions = dict(sessions)  # group name -> session id (= child pid)

    def __enter__(self) -> CpuWindow:
        self.start_total, self.start_irq = machine_cpu_ms()
        self.start_procs = process_table()
        self.start_self = _own_cpu_ms()
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        total, irq = machine_cpu_ms()
        self.total_ms = total - self.start_total
        self.wall_s = time.monotonic() - self.started
        end = process_table()
        groups: dict[str, float] = {name: 0.0 for name in self.sessions}
        groups.update(
            postgres=0.0,
            rabbitmq=0.0,
            bench_and_load=_own_cpu_ms() - self.start_self,
            irq=irq - self.start_irq,
        )
        by_session = {sid: name for name, sid in self.sessions.items()}
        for pid, now in end.items():
            before = self.start_procs.get(pid)
            spent = now.cpu_ms - (before.cpu_ms if before and before.comm == now.comm else 0.0)
            if now.session in by_session:
                groups[by_session[now.session]] += spent
            elif now.comm == "postgres":
                groups["postgres"] += spent
            elif now.comm in self.RABBIT:
                groups["rabbitmq"] += spent
        # Everything else: other users of a shared machine, kernel threads, processes
        # that exited during the window (PostgreSQL backends of closed connections).
        groups["other"] = max(0.0, self.total_ms - sum(groups.values()))
        self.groups = groups

    @property
    def own_ms(self) -> float:
        """The window's machine CPU without what other users of the machine spent."""
        return self.total_ms - self.groups["other"]


def _own_cpu_ms() -> float:
    """This process plus its waited-for children (wrk, pgbench): the load generators."""
    t = os.times()
    return (t.user + t.system + t.children_user + t.children_system) * 1000.0


@contextlib.contextmanager
def migrated_database(admin_url: str) -> Iterator[str]:
    """The URL of a private database with every migration applied; dropped afterwards."""
    from flowforge.store.migrate import migrate

    database = PrivateDatabase.create(admin_url)
    try:
        migrate(database.url)
        yield database.url
    finally:
        database.drop()
