"""A throwaway PgBouncer in transaction mode, in front of the test PostgreSQL.

Its own ini, auth file, log and pid in a temp directory, on a free loopback port; the
child of the test, never Debian's service. Its pool is smaller than the number of clients
so that consecutive transactions of one client land on different server sessions, as in
production: that is what breaks server-side prepared statements and session settings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.support.processes import free_port, wait_for
from tests.support.services import unavailable

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
# Fewer server sessions than clients (bin/api's and bin/worker's pools together).
SERVER_POOL_SIZE = 3

INI = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {root}/users.txt
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 200
server_reset_query =
logfile = {root}/pgbouncer.log
pidfile = {root}/pgbouncer.pid
{user_line}
"""


class PgBouncer:
    """pgbouncer <own ini>, as a child process; `url(dbname)` reaches a database through it."""

    def __init__(self, admin_url: str) -> None:
        if not Path(PGBOUNCER).exists():
            unavailable("pgbouncer (.ci/run installs Debian's)")
        params = psycopg.conninfo.conninfo_to_dict(admin_url)
        self.user = str(params.get("user") or "postgres")
        self.root = Path(tempfile.mkdtemp(prefix="ff-pgbouncer-"))
        self.port = free_port()
        # PgBouncer refuses to run as root; started as root it switches to `user`.
        user_line = "user = postgres" if os.geteuid() == 0 else ""
        if user_line:
            shutil.chown(self.root, "postgres")
        (self.root / "users.txt").write_text(f'"{self.user}" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            INI.format(
                host=params.get("host") or "127.0.0.1",
                port=params.get("port") or 5432,
                listen_port=self.port,
                root=self.root,
                pool_size=SERVER_POOL_SIZE,
                user_line=user_line,
            )
        )
        self.proc = subprocess.Popen(
            [PGBOUNCER, str(self.root / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._admin = psycopg.conninfo.make_conninfo(admin_url, dbname="postgres")
        wait_for(self._answers, timeout=20, message="pgbouncer to accept connections")

    def url(self, database_url: str) -> str:
        """`database_url`'s database, through this PgBouncer."""
        return psycopg.conninfo.make_conninfo(database_url, host="127.0.0.1", port=str(self.port))

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited early:\n{self.log()}")
        try:
            psycopg.connect(self.url(self._admin), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)
