"""A throwaway Patroni cluster on one machine: etcd, two PostgreSQL nodes each run by its
own Patroni, and HAProxy sending connections to whichever node Patroni's REST API calls
the primary (`GET /primary` answers 200 only there). The recipe of
docs/howto/several-hosts.md ("Failover that promotes itself"), on free loopback ports,
in a temporary directory removed by stop(). Debian's `patroni`, `etcd-server` and
`haproxy` (.ci/run installs them); PostgreSQL and Patroni run as the postgres user when
the tests run as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import requests

from tests.bench.infra import _as_user, _pg_bindir, _postgres_owner
from tests.support.processes import free_port, wait_for
from tests.support.services import unavailable

PATRONI = shutil.which("patroni") or "/usr/bin/patroni"
PATRONICTL = shutil.which("patronictl") or "/usr/bin/patronictl"
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"

# Leader key TTL and Patroni's loop: a dead primary's key lapses within TTL_S, and the
# replica takes it on its next loop. The smallest values Patroni accepts keep the test
# short; production keeps its defaults (30 s, 10 s) or chooses these knowingly.
TTL_S = 10
LOOP_WAIT_S = 1
RETRY_TIMEOUT_S = 4

NODE = """\
scope: flowforge
name: {name}
restapi:
  listen: 127.0.0.1:{rest_port}
  connect_address: 127.0.0.1:{rest_port}
etcd:
  host: 127.0.0.1:{etcd_port}
  protocol: http
bootstrap:
  dcs:
    ttl: {ttl}
    loop_wait: {loop_wait}
    retry_timeout: {retry_timeout}
    maximum_lag_on_failover: 1073741824
    synchronous_mode: {synchronous}
    postgresql:
      use_pg_rewind: false
      parameters:
        fsync: "off"
        wal_level: replica
        hot_standby: "on"
        max_wal_senders: 5
        max_replication_slots: 5
        wal_keep_size: 128MB
        max_connections: 100
  initdb:
    - encoding: UTF8
    - auth: trust
postgresql:
  listen: 127.0.0.1:{pg_port}
  connect_address: 127.0.0.1:{pg_port}
  data_dir: {root}/{name}
  bin_dir: {bindir}
  pgpass: {root}/{name}.pgpass
  parameters:
    unix_socket_directories: {root}
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: postgres
      password: postgres
"""

HAPROXY_CFG = """\
global
    maxconn 200
defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s
listen postgres
    bind 127.0.0.1:{port}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
{servers}
"""


class Node:
    """One Patroni process and the PostgreSQL it runs."""

    def __init__(self, name: str, root: Path, owner: tuple[int, int] | None) -> None:
        self.name = name
        self.root = root
        self.owner = owner
        self.pg_port = free_port()
        self.rest_port = free_port()
        self.config = root / f"{name}.yml"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"

    def start(self) -> None:
        log = open(self.root / f"{self.name}.log", "ab")  # noqa: SIM115 - the child keeps it
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        self.proc = subprocess.Popen(
            [PATRONI, str(self.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_as_user(self.owner),
            env={**env, "HOME": str(self.root)},
            cwd=self.root,
        )
        log.close()

    def kill(self) -> None:
        """SIGKILL Patroni and all of its PostgreSQL together: the loss of the host.

        Patroni starts the postmaster in a process group of its own (so that PostgreSQL
        survives a restart of Patroni); its backends share that group. Killing the
        postmaster alone would leave the backends serving their open connections."""
        data = self.root / self.name
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((data / "postmaster.pid").read_text().split()[0])
            # Only our postmaster's group, never whatever reused a stale pid.
            if str(data).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.killpg(os.getpgid(pid), signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def role(self) -> str | None:
        """What this node's Patroni says it is (`primary`, `replica`), or None. Patroni
        before 3.0.3 says `master` for the primary."""
        try:
            r = requests.get(f"http://127.0.0.1:{self.rest_port}/patroni", timeout=1)
            role = str(r.json().get("role"))
        except (requests.RequestException, ValueError):
            return None
        return "primary" if role == "master" else role

    def log(self) -> str:
        path = self.root / f"{self.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


class PatroniCluster:
    """etcd, two Patroni nodes, HAProxy following the leader. `url(dbname)` goes through
    HAProxy; `leader()` is the node Patroni calls primary."""

    def __init__(self, synchronous: bool = False) -> None:
        for tool in (PATRONI, ETCD, HAPROXY):
            if not Path(tool).exists():
                unavailable(f"{tool} (.ci/run installs patroni, etcd-server and haproxy)")
        self.synchronous = synchronous
        self.owner = _postgres_owner()
        self.root = Path(tempfile.mkdtemp(prefix="ff-patroni-"))
        if self.owner is not None:
            shutil.chown(self.root, self.owner[0], self.owner[1])
        self.children: list[subprocess.Popen[bytes]] = []
        self.etcd_port = free_port()
        self.nodes: list[Node] = []
        try:
            self._start_etcd()
            bindir = _pg_bindir()
            for name in ("pg1", "pg2"):
                node = Node(name, self.root, self.owner)
                node.config.write_text(
                    NODE.format(
                        name=name,
                        rest_port=node.rest_port,
                        etcd_port=self.etcd_port,
                        ttl=TTL_S,
                        loop_wait=LOOP_WAIT_S,
                        retry_timeout=RETRY_TIMEOUT_S,
                        synchronous="true" if synchronous else "false",
                        pg_port=node.pg_port,
                        root=self.root,
                        bindir=bindir,
                    )
                )
                if self.owner is not None:
                    os.chown(node.config, self.owner[0], self.owner[1])
                self.nodes.append(node)
            self.nodes[0].start()
            wait_for(
                lambda: self.nodes[0].role() == "primary",
                timeout=40,
                interval=0.5,
                message="pg1 to bootstrap as primary",
            )
            self.nodes[1].start()
            wait_for(
                lambda: self._streaming(synchronous),
                timeout=60,
                interval=0.5,
                message="pg2 to stream from pg1",
            )
            self.port = free_port()
            self._start_haproxy()
            # HAProxy counts a server up until its checks say otherwise: wait until the
            # replica is marked down (2 checks 0.5 s apart) and 5 connections in a row
            # reach the primary.
            time.sleep(1.5)
            wait_for(
                lambda: all(self._through_haproxy() for _ in range(5)),
                timeout=30,
                message="HAProxy to reach only the primary",
            )
        except BaseException as exc:
            logs = "\n".join(f"--- {n.name}\n{n.log()[-1500:]}" for n in self.nodes)
            self.stop()
            raise AssertionError(f"{exc}\n{logs}") from exc

    def _start_etcd(self) -> None:
        peer = free_port()
        proc = subprocess.Popen(
            [
                ETCD,
                "--name",
                "etcd1",
                "--data-dir",
                str(self.root / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{self.etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{self.etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"etcd1=http://127.0.0.1:{peer}",
                "--enable-v2=true",  # Debian's patroni speaks etcd's v2 API (python3-etcd)
            ],
            stdout=open(self.root / "etcd.log", "ab"),  # noqa: SIM115 - the child keeps it
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.children.append(proc)

        def healthy() -> bool:
            try:
                url = f"http://127.0.0.1:{self.etcd_port}/health"
                return requests.get(url, timeout=1).json().get("health") == "true"
            except (requests.RequestException, ValueError):
                return False

        wait_for(healthy, timeout=30, message="etcd to answer")

    def _start_haproxy(self) -> None:
        servers = "\n".join(
            f"    server {n.name} 127.0.0.1:{n.pg_port} check port {n.rest_port}"
            for n in self.nodes
        )
        cfg = self.root / "haproxy.cfg"
        cfg.write_text(HAPROXY_CFG.format(port=self.port, servers=servers))
        proc = subprocess.Popen(
            [HAPROXY, "-f", str(cfg), "-db"],
            stdout=open(self.root / "haproxy.log", "ab"),  # noqa: SIM115 - the child keeps it
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.children.append(proc)

    def _streaming(self, synchronous: bool) -> bool:
        try:
            with psycopg.connect(self.nodes[0].url, autocommit=True, connect_timeout=2) as conn:
                rows = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall()
        except psycopg.OperationalError:
            return False
        return bool(rows) and (not synchronous or rows[0][0] in ("sync", "quorum"))

    def _through_haproxy(self) -> bool:
        try:
            with psycopg.connect(self.url("postgres"), connect_timeout=2) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        except psycopg.OperationalError:
            return False
        return bool(row) and row[0] is False

    def url(self, dbname: str) -> str:
        """`dbname` through HAProxy: always the current primary."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def leader(self) -> Node:
        for node in self.nodes:
            if node.role() == "primary":
                return node
        raise AssertionError("no node is primary")

    def replica(self) -> Node:
        return next(n for n in self.nodes if n is not self.leader())

    def switchover(self) -> None:
        """A planned switchover to the replica, through the leader's REST API."""
        leader, candidate = self.leader(), self.replica()
        r = requests.post(
            f"http://127.0.0.1:{leader.rest_port}/switchover",
            data=json.dumps({"leader": leader.name, "candidate": candidate.name}),
            timeout=30,
        )
        if r.status_code != 200:
            raise AssertionError(f"switchover refused: {r.status_code} {r.text}")

    def describe(self) -> str:
        """What each node says it is, and the tail of HAProxy's and each node's log: the
        story of a failover that did not come back."""
        parts = [f"{n.name}: role {n.role()!r}" for n in self.nodes]
        haproxy = self.root / "haproxy.log"
        if haproxy.exists():
            parts.append("--- haproxy\n" + haproxy.read_text(errors="replace")[-1500:])
        for node in self.nodes:
            lines = [line for line in node.log().splitlines() if "no action" not in line]
            parts.append(f"--- {node.name}\n" + "\n".join(lines[-25:]))
        return "\n".join(parts)

    def stop(self, keep: Path | None = None) -> None:
        """Kill everything and remove the directory; `keep`: copy the logs there first
        (etcd, HAProxy, each Patroni and its PostgreSQL), for the failure's story."""
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for log in self.root.glob("**/*.log"):
                with contextlib.suppress(OSError):
                    shutil.copy(log, keep / f"{log.parent.name}-{log.name}")
        for node in self.nodes:
            node.kill()
        for proc in self.children:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)
