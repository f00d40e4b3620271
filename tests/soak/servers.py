"""The servers a randomized run uses, by mode:

- shared: the machine's PostgreSQL and RabbitMQ (never stopped: only per-worker proxies
  fault them);
- own: a throwaway PostgreSQL and RabbitMQ of the run's own (tests/support/own_servers.py),
  which the nemesis stops (fast, immediate), SIGKILLs and starts again;
- ha: a synchronous primary/standby pair (tests/support/replication.py) behind one
  multi-host URL and a three-node RabbitMQ cluster with quorum queues
  (tests/support/rabbitcluster.py); the nemesis fails PostgreSQL over once and kills the
  node that leads the steps queue once. Workers reach these directly (a proxy in front
  of one host would hide the failover), so link faults are off in this mode;
- ha-partial: the same, but the primary's own synchronous_commit is `local` and only
  what FLOWFORGE_SYNC_UNSAFE_CLAIMS and FLOWFORGE_SYNC_INTAKE ask for waits for the
  standby (docs/howto/several-hosts.md): the checker's promises must hold all the same.

A server outage runs on a thread of its own (a start waits for the server), one at a
time; `outage_s` lists every outage for the checker's "recovery while the rest could work"
accounting (wall clock, start and end)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tests.soak.history import History
from tests.soak.pressure import SmallDisk, storm

MODES = ("shared", "own", "ha", "ha-partial")
HA = ("ha", "ha-partial")


class Servers:
    """Starts the mode's servers; its nemesis operations; closes them."""

    def __init__(self, mode: str, admin_url: str, amqp_url: str) -> None:
        if mode not in MODES:
            raise ValueError(f"servers: one of {MODES}")
        self.mode = mode
        self.admin_url, self.amqp_url = admin_url, amqp_url
        self.extra_env: dict[str, str] = {}
        self.outages: list[tuple[float, float, str]] = []
        self._busy = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.pg: Any = None
        self.rabbit: Any = None
        self.replicated: Any = None
        self.rabbits: Any = None
        self.failed_over = self.node_lost = False
        # The quorum queue whose leader node the nemesis kills (set by the run).
        self.steps_queue = ""
        # The executions table's small disk (own mode, set up by attach_disk).
        self.disk: SmallDisk | None = None
        if mode == "own":
            from tests.support.own_servers import OwnPostgres, OwnRabbitMQ

            self.pg = OwnPostgres({"max_connections": "200"})
            self.rabbit = OwnRabbitMQ()
            self.admin_url, self.amqp_url = self.pg.url, self.rabbit.url
        elif mode in HA:
            import psycopg

            from tests.support.rabbitcluster import RabbitCluster
            from tests.support.replication import Replicated

            self.replicated = Replicated(synchronous=True)
            self.rabbits = RabbitCluster(3)
            self.admin_url = self.replicated.url("postgres")
            self.amqp_url = self.rabbits.urls
            self.extra_env = {"FLOWFORGE_AMQP_QUEUE_TYPE": "quorum"}
            if mode == "ha-partial":
                with psycopg.connect(self.replicated.primary.url, autocommit=True) as conn:
                    conn.execute("ALTER SYSTEM SET synchronous_commit = 'local'")
                    conn.execute("SELECT pg_reload_conf()")
                self.extra_env |= {
                    "FLOWFORGE_SYNC_UNSAFE_CLAIMS": "on",
                    "FLOWFORGE_SYNC_INTAKE": "on",
                }

    @property
    def proxied(self) -> bool:
        """Whether workers go through per-worker fault proxies."""
        return self.mode not in HA

    @property
    def busy(self) -> bool:
        return self._busy.locked()

    def operations(self) -> dict[str, float]:
        """The nemesis's server operations and their weights, for this mode."""
        if self.mode == "own":
            found = {"pg_server": 0.5, "amqp_server": 0.4, "pg_storm": 0.3}
            return found | ({"pg_disk": 0.3} if self.disk is not None and self.disk.ready else {})
        if self.mode in HA:
            return {"pg_failover": 0.3, "amqp_node_loss": 0.3}
        return {}

    def _outage(self, history: History, op: str, body: Callable[[], str]) -> bool:
        """Run `body` (the outage and its end) on its own thread, one at a time; False
        when another outage is in progress (nothing was done)."""
        if not self._busy.acquire(blocking=False):
            return False

        def run() -> None:
            began = time.time()
            try:
                detail = body()
            finally:
                self.outages.append((began, time.time(), op))
                self._busy.release()
            history.fault(f"{op}_up", "server", detail)

        history.fault(op, "server")
        thread = threading.Thread(target=run, name=f"soak-{op}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return True

    def attach_disk(self, database_url: str) -> None:
        """Own mode, as root: the run database's executions table on a small disk of its
        own, which the `pg_disk` operation fills (tests/soak/pressure.py)."""
        if self.pg is not None:
            self.disk = SmallDisk()
            self.disk.attach(self.admin_url, database_url)

    def perform(self, op: str, history: History, duration: float, coin: float) -> None:
        """One server operation (draws: how long it stays down, which way it goes down)."""
        down_s = 1.0 + 7.0 * duration
        if op == "pg_storm" and self.pg is not None:
            url = self.admin_url
            self._outage(history, op, lambda: storm(url, 1.0 + 4.0 * duration))
        elif op == "pg_disk" and self.disk is not None and self.disk.ready:
            disk = self.disk
            self._outage(history, op, lambda: disk.fill(1.0 + 5.0 * duration))
        elif op == "pg_server" and self.pg is not None:
            pg = self.pg

            def pg_body() -> str:
                how = "fast" if coin < 0.35 else "immediate" if coin < 0.7 else "kill"
                if how == "kill":
                    pg.kill()
                else:
                    pg.stop(how)
                time.sleep(down_s)
                pg.start()
                return f"{how}, down {down_s:.1f}s"

            self._outage(history, op, pg_body)
        elif op == "amqp_server" and self.rabbit is not None:
            rabbit = self.rabbit

            def amqp_body() -> str:
                if coin < 0.5:
                    rabbit.stop_app()
                    time.sleep(down_s)
                    rabbit.start_app()
                    return f"app stopped {down_s:.1f}s"
                rabbit.kill()
                time.sleep(down_s)
                rabbit.start()
                return f"killed, down {down_s:.1f}s"

            self._outage(history, op, amqp_body)
        elif op == "pg_failover" and self.replicated is not None and not self.failed_over:
            replicated = self.replicated

            def failover_body() -> str:
                replicated.fail_over()
                return "primary killed, standby promoted"

            # Once per run, and only once it really began: a draw that lands while
            # another outage runs is no failover (before, it used up the only one).
            self.failed_over = self._outage(history, op, failover_body)
        elif op == "amqp_node_loss" and self.rabbits is not None and not self.node_lost:
            rabbits, queue = self.rabbits, self.steps_queue

            def node_body() -> str:
                leader = rabbits.leader_of(queue)
                leader.kill()
                return f"killed {leader.name}, the leader of {queue}"

            self.node_lost = self._outage(history, op, node_body)

    def heal(self, timeout: float = 120.0) -> None:
        """The quiet period: wait for the outage in progress to end (servers up again)."""
        for thread in self._threads:
            thread.join(timeout)

    def close(self) -> None:
        self.heal()
        if self.pg is not None:
            self.pg.close()
        if self.disk is not None:
            self.disk.close()
        if self.rabbit is not None:
            self.rabbit.close()
        if self.replicated is not None:
            self.replicated.stop()
        if self.rabbits is not None:
            self.rabbits.stop()
