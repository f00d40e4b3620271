"""A throwaway PostgreSQL primary with a streaming standby (`pg_basebackup -R`) on free
loopback ports, for failover tests. Both run as the postgres user when the tests run as
root, are children of the test, and are removed with their data by stop()."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from flowforge.store import apikeys
from flowforge.store.migrate import migrate
from tests.bench.infra import _as_user, _pg_bindir, _postgres_owner
from tests.support.delayproxy import DelayProxy
from tests.support.faultproxy import FaultProxy
from tests.support.processes import free_port, kill_session, wait_for


def migrated_database(server_url: str, name: str, key_name: str) -> tuple[str, str]:
    """Database `name` made on the server (`server_url`'s) and migrated: its URL and a new
    API key with every permission, named `key_name`."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = psycopg.conninfo.make_conninfo(server_url, dbname=name)
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        return url, apikeys.create(conn, key_name)[1]


class Server:
    """One postgres process on its own data directory and port."""

    def __init__(self, bindir: Path, data: Path, root: Path, owner: tuple[int, int] | None) -> None:
        self.port = free_port()
        self.data = data
        self.log = open(root / f"{data.name}.log", "ab")  # noqa: SIM115 - closed in kill()
        argv = [str(bindir / "postgres"), "-D", str(data)]
        for name, value in {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(root),
            "fsync": "off",  # a test cluster; durability across an OS crash is not tested
        }.items():
            argv += ["-c", f"{name}={value}"]
        self.proc = subprocess.Popen(
            argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_as_user(owner),
        )
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        wait_for(self._answers, timeout=60, interval=0.2, message=f"postgres on {self.port}")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError("postgres exited during start-up")
        try:
            psycopg.connect(self.url, connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the postmaster's whole session: the loss of the host."""
        kill_session(self.proc, 30)
        self.log.close()


class Replicated:
    """primary → standby, asynchronous unless `synchronous`. With `via_proxy` the standby
    streams through a FaultProxy (`self.link`): `link.cut()` is the replication link lost
    while both servers and their clients carry on. With `delayed` it streams through a
    DelayProxy (`self.delay`) whose `delay_s` is the link's one-way delay."""

    def __init__(
        self, synchronous: bool = False, via_proxy: bool = False, delayed: bool = False
    ) -> None:
        self.bindir = _pg_bindir()
        self.owner = _postgres_owner()
        self.root = Path(tempfile.mkdtemp(prefix="ff-failover-"))
        if self.owner is not None:
            shutil.chown(self.root, self.owner[0], self.owner[1])
        self._run(
            "initdb", "-D", str(self.root / "primary"), "-A", "trust", "-U", "postgres", "--no-sync"
        )
        self.primary = Server(self.bindir, self.root / "primary", self.root, self.owner)
        self._run(
            "pg_basebackup",
            "-D",
            str(self.root / "standby"),
            "-R",
            "-X",
            "stream",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "postgres",
        )
        self.link: FaultProxy | None = None
        self.delay: DelayProxy | None = None
        self.restarted: list[Server] = []
        if via_proxy:
            self.link = FaultProxy("127.0.0.1", self.primary.port)
            self._stream_from(self.link.port)
        elif delayed:
            self.delay = DelayProxy(self.primary.port)
            self._stream_from(self.delay.port)
        self.standby = Server(self.bindir, self.root / "standby", self.root, self.owner)
        wait_for(self._streaming, timeout=60, interval=0.2, message="the standby to stream")
        if synchronous:
            # On the primary only, after the base backup: the promoted standby must not
            # wait for a standby of its own that does not exist.
            with psycopg.connect(self.primary.url, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("SELECT pg_reload_conf()")

    def _stream_from(self, port: int) -> None:
        """Point the standby's primary_conninfo at `port` (a proxy) before it starts."""
        with open(self.root / "standby" / "postgresql.auto.conf", "a") as conf:
            conf.write(f"primary_conninfo = 'host=127.0.0.1 port={port} user=postgres'\n")

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            [str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            timeout=180,
            preexec_fn=_as_user(self.owner),
        )
        if done.returncode != 0:
            raise AssertionError(f"{tool} failed: {done.stderr[-800:]}")

    def _streaming(self) -> bool:
        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_replication").fetchone()
        return bool(row and row[0])

    def url(self, dbname: str) -> str:
        """Both hosts, the writable one wanted: what survives a promotion."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{dbname}?target_session_attrs=read-write"
        )

    def fail_over(self) -> float:
        """Kill the primary, promote the standby; the monotonic time of the kill."""
        self.primary.kill()
        killed_at = time.monotonic()
        self._run("pg_ctl", "promote", "-w", "-D", str(self.standby.data))
        return killed_at

    def restart_old_primary(self) -> Server:
        """The killed primary started again, alone, on a new port: what the failover
        report reads (docs/howto/several-hosts.md)."""
        old = Server(self.bindir, self.primary.data, self.root, self.owner)
        self.restarted.append(old)
        return old

    def stop(self) -> None:
        self.primary.kill()
        self.standby.kill()
        for server in self.restarted:
            server.kill()
        for proxy in (self.link, self.delay):
            if proxy is not None:
                proxy.close()
        shutil.rmtree(self.root, ignore_errors=True)
