"""A throwaway RabbitMQ cluster of three nodes on this machine, for node-loss tests.

Each node has its own node name, AMQP and distribution ports (loopback), data and log
directories and an empty plugin list, under one temp directory with its own Erlang cookie
(HOME); the shared broker and its cookie are never touched. The nodes are children of the
test (one session each) and are removed, data and all, by stop().
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.processes import free_port, kill_session
from tests.support.services import unavailable

BIN = Path("/usr/lib/rabbitmq/bin")
START_TIMEOUT_S = 180


class Node:
    """One rabbitmq-server of the cluster."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = f"{name}@localhost"
        self.port = free_port()
        self.dir = root / name
        self.dir.mkdir()
        (self.dir / "plugins").write_text("[].\n")
        self.env = {
            **os.environ,
            "HOME": str(root / "home"),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "none"),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
        }
        self.log = open(self.dir / "out.log", "wb")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(
            [str(BIN / "rabbitmq-server")],
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def ctl(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [str(BIN / "rabbitmqctl"), "-n", self.name, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise AssertionError(f"rabbitmqctl {' '.join(args)} on {self.name}: {done.stderr}")
        return done.stdout

    def kill(self) -> None:
        """SIGKILL the node, the loss of a host."""
        kill_session(self.proc, 10)
        self.log.close()


class RabbitCluster:
    """Three clustered nodes; `urls` is a FLOWFORGE_AMQP_URL listing all of them."""

    def __init__(self, size: int = 3) -> None:
        if not (BIN / "rabbitmq-server").exists():
            unavailable("rabbitmq-server (Debian's rabbitmq-server package)")
        self.root = Path(tempfile.mkdtemp(prefix="ff-rabbit-"))
        home = self.root / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(uuid.uuid4().hex)
        cookie.chmod(0o400)
        tag = uuid.uuid4().hex[:6]
        self.nodes = [Node(self.root, f"ff{tag}{i}") for i in range(size)]
        try:
            with ThreadPoolExecutor(size) as pool:
                list(pool.map(self._await, self.nodes))
            seed = self.nodes[0]
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", seed.name)
                node.ctl("start_app")
            for node in self.nodes:
                self._await(node)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _await(node: Node) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if node.proc.poll() is not None:
                raise AssertionError(f"{node.name} exited:\n{(node.dir / 'out.log').read_text()}")
            try:
                node.ctl("await_startup", "--timeout", "10", timeout=30)
                return
            except (AssertionError, subprocess.TimeoutExpired):
                if time.monotonic() > deadline:
                    raise

    @property
    def urls(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def leader_of(self, queue: str) -> Node:
        """The node that leads the quorum queue `queue`."""
        alive = next(node for node in self.nodes if node.proc.poll() is None)
        for line in alive.ctl(
            "-q", "list_queues", "name", "leader", "--no-table-headers"
        ).splitlines():
            name, _, leader = line.partition("\t")
            if name == queue:
                return next(node for node in self.nodes if node.name == leader.strip())
        raise AssertionError(f"queue {queue} not found")

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.root, ignore_errors=True)
