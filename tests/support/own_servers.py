"""Throwaway PostgreSQL and RabbitMQ servers for tests that stop, kill or restart a server.

The local PostgreSQL (5432) and RabbitMQ (5672) are shared by everyone on the machine; a
test must never stop them. A test that needs a whole-server outage starts its own server
on a free loopback port with its data in a temp dir, does what it likes to it, and removes
it afterwards. Both classes run the locally installed binaries; as root, PostgreSQL runs
as the `postgres` user (it refuses root).

Use the fixtures `own_postgres` and `own_rabbitmq` (registered in tests/conftest.py), and
point the processes under test at them, e.g. by overriding `database_url` in the module:

    @pytest.fixture
    def database_url(own_postgres: OwnPostgres) -> Iterator[str]:
        with own_postgres.database() as url:
            yield url
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from flowforge.store.migrate import migrate
from tests.support.processes import kill_session, server_port, wait_for
from tests.support.services import amqp_answers

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


def _postgres_bindir() -> Path:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if candidates:
        return candidates[-1].parent
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _as_postgres_user() -> Callable[[], None] | None:
    """preexec_fn dropping root to `postgres` (initdb and postgres refuse to run as root)."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam("postgres")

    def drop() -> None:
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)

    return drop


def _stop(
    proc: subprocess.Popen[bytes] | None,
    ask: Callable[[subprocess.Popen[bytes]], object],
    kill: Callable[[], None],
) -> None:
    """Ask a running server to stop, give it a minute, then kill it."""
    if proc is not None and proc.poll() is None:
        ask(proc)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            kill()


class OwnPostgres:
    """A PostgreSQL cluster of the test's own: stop it (any mode), SIGKILL its postmaster,
    start it again on the same port and data; `close()` removes it for good."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.bindir = _postgres_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="ff-test-pg-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.port = server_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.root),
            "fsync": "off",
            "max_connections": "100",
            **(settings or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        initdb = [str(self.bindir / "initdb"), "--no-sync", "-A", "trust", "-U", "postgres"]
        subprocess.run(
            [*initdb, "-D", str(self.data)],
            capture_output=True,
            check=True,
            timeout=120,
            preexec_fn=_as_postgres_user(),
        )
        self.start()

    def start(self) -> None:
        """Start the postmaster and wait until it accepts connections."""
        argv = [str(self.bindir / "postgres"), "-D", str(self.data)]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        drop = _as_postgres_user()

        def preexec() -> None:
            os.setsid()
            if drop is not None:
                drop()

        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec
            )
        wait_for(self.ready, timeout=60, interval=0.1, message="own PostgreSQL to start")

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"own PostgreSQL is not running:\n{self.log_tail()}")
        try:
            psycopg.connect(self.url, connect_timeout=2).close()
            return True
        except psycopg.OperationalError:
            return False

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, mode: str = "fast") -> None:
        """Shut down like `pg_ctl stop -m MODE` (smart, fast or immediate)."""
        signum = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}
        _stop(self.proc, lambda proc: proc.send_signal(signum[mode]), self.kill)

    def kill(self) -> None:
        """SIGKILL the postmaster; its backends notice and exit, the next start recovers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        # Orphaned backends hold the shared memory; wait for them to go.
        wait_for(lambda: not _pids_of(self.data), timeout=30, message="backends to exit")

    @contextlib.contextmanager
    def stopped(self, mode: str = "fast") -> Iterator[None]:
        """The server is down for the body of the block and started again no matter what."""
        self.stop(mode)
        try:
            yield
        finally:
            self.start()

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """A new migrated database on this server; yields its URL, dropped afterwards."""
        name = f"ff_t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = psycopg.conninfo.make_conninfo(self.url, dbname=name)
        migrate(url)
        yield url
        with contextlib.suppress(psycopg.Error), psycopg.connect(self.url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        """Stop the server (immediately: nothing in it is worth keeping) and remove it."""
        if self.proc is not None and self.proc.poll() is None:
            self.stop("immediate")
        with contextlib.suppress(AssertionError):
            self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def _pids_of(data: Path) -> list[int]:
    """PostgreSQL processes still running on `data` (postmaster or orphaned backends)."""
    found = []
    marker = str(data).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            backend = (entry / "comm").read_text().strip() == "postgres"
            if marker in (entry / "cmdline").read_bytes() or (backend and _cwd_is(entry, data)):
                found.append(int(entry.name))
    return found


def _cwd_is(entry: Path, data: Path) -> bool:
    with contextlib.suppress(OSError):
        return os.readlink(entry / "cwd") == str(data)
    return False


class OwnRabbitMQ:
    """A RabbitMQ node of the test's own (own node name, AMQP and distribution ports,
    mnesia and log dirs in a temp dir): stop and start its app, stop or SIGKILL the whole
    node and start it again on the same data; `close()` stops and removes it."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ff-test-rmq-"))
        self.node = f"ff-test-{uuid.uuid4().hex[:8]}@localhost"
        self.port = server_port()
        self.dist_port = server_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"
        self.log_path = self.root / "server.log"
        home = self.root / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(uuid.uuid4().hex)
        cookie.chmod(0o400)
        (self.root / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users = none\n"
        )
        (self.root / "env.conf").write_text("")
        (self.root / "plugins").write_text("[].\n")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))},
            "HOME": str(home),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.root / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.root / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "plugins"),
            "RABBITMQ_PID_FILE": str(self.root / "pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def ctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """rabbitmqctl against this node only."""
        return subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-q", "-n", self.node, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self) -> None:
        """Start the node (on its existing data) and wait until AMQP answers."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self.ready, timeout=90, interval=0.3, message="own RabbitMQ to start")

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise AssertionError(f"own RabbitMQ is not running:\n{tail}")
        return amqp_answers(self.url, timeout=2)

    def stop_app(self) -> None:
        result = self.ctl("stop_app")
        assert result.returncode == 0, result.stderr

    def start_app(self) -> None:
        result = self.ctl("start_app")
        assert result.returncode == 0, result.stderr
        wait_for(lambda: amqp_answers(self.url, timeout=2), timeout=60, message="own RabbitMQ app")

    @contextlib.contextmanager
    def app_stopped(self) -> Iterator[None]:
        """`rabbitmqctl stop_app` for the block (the node stays up), then `start_app`."""
        self.stop_app()
        try:
            yield
        finally:
            self.start_app()

    def stop(self) -> None:
        """Stop the whole node (`rabbitmqctl -n NODE stop`)."""
        _stop(self.proc, lambda _proc: self.ctl("stop"), self.kill)

    def kill(self) -> None:
        """SIGKILL the node's whole process group (beam and its helpers)."""
        if self.proc is not None:
            kill_session(self.proc)

    def close(self) -> None:
        self.stop()
        self.kill()
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def _skip_without(binary: Path) -> None:
    if not binary.exists():
        message = f"{binary} is not installed"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (CI=true: failing instead of skipping)", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[OwnPostgres]:
    """A PostgreSQL server of the module's own; stop, kill and restart it at will."""
    _skip_without(_postgres_bindir() / "initdb")
    server = OwnPostgres()
    yield server
    server.close()


@pytest.fixture(scope="module")
def own_rabbitmq() -> Iterator[OwnRabbitMQ]:
    """A RabbitMQ node of the module's own; stop, kill and restart it at will."""
    _skip_without(RABBITMQ_BIN / "rabbitmq-server")
    server = OwnRabbitMQ()
    yield server
    server.close()
