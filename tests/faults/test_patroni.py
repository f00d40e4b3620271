"""Failover that promotes itself (issue 42): the Patroni recipe of
docs/howto/several-hosts.md, on one machine — etcd, two PostgreSQL nodes each run by
Patroni, HAProxy following the leader through Patroni's `GET /primary` check. bin/api and
bin/worker know only HAProxy's address.

- The leader's host is lost (Patroni and PostgreSQL SIGKILLed) while webhooks arrive:
  Patroni promotes the replica once the leader key lapses, HAProxy follows, intake and
  work come back without a restart. With `synchronous_mode` nothing acknowledged is lost;
  without it the test prints what was.
- A planned switchover under load loses nothing in either mode.

Each test prints its figures (the how-to quotes them). Runtime: about 40 s each.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
import requests

from tests.support.api import Api
from tests.support.definitions import NUMBERED
from tests.support.patroni import PatroniCluster
from tests.support.processes import (
    Process,
    process_env,
    start_api,
    start_worker,
    wait_for,
)
from tests.support.replication import migrated_database

# Long form, outside CI: in one of two full CI runs the leader-loss case timed out waiting
# 90 s for a 202 after the kill (10.6 s in the other); nine runs since came back in
# 10.5-11.8 s, so the cause is not known, and a failure now prints the cluster's story.
# The three cases take minutes, beyond CI's budget for a test; the failover matrix
# (`python -m tests.soak.failover_matrix --only patroni`) sets FLOWFORGE_TEST_PATRONI=1.
pytestmark = pytest.mark.skipif(
    os.environ.get("FLOWFORGE_TEST_PATRONI") != "1",
    reason="long form: set FLOWFORGE_TEST_PATRONI=1 (the failover matrix does)",
)

DB = "ff_patroni"


class Load:
    """Posts webhooks one after another; remembers which were acknowledged, and when
    (wall clock, to compare with PostgreSQL's timestamps on the same machine)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.acked: dict[str, float] = {}
        self.sent: dict[str, float] = {}  # when the request of each acknowledged one left
        self.statuses: list[tuple[float, int]] = []  # every answer: when, status
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            sent = time.time()
            try:
                r = requests.post(f"{self.base}/hooks/t", json={"n": n}, timeout=5)
            except requests.RequestException:
                time.sleep(0.05)
                continue
            self.statuses.append((time.time(), r.status_code))
            if r.status_code == 202:
                self.acked[r.json()["execution_id"]] = time.time()
                self.sent[r.json()["execution_id"]] = sent
            else:
                time.sleep(0.05)

    def first_after(self, moment: float) -> float | None:
        """The first 202 to a request sent after `moment`."""
        later = [self.acked[e] for e, t in list(self.sent.items()) if t > moment]
        return min(later) if later else None

    def answers(self, since: float) -> dict[int, list[int]]:
        """The statuses answered after `since`, by whole second after it."""
        by_second: dict[int, list[int]] = {}
        for at, status in list(self.statuses):
            if at > since:
                by_second.setdefault(int(at - since), []).append(status)
        return by_second

    def longest_gap(self) -> float:
        times = sorted(self.acked.values())
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(10)


class Running:
    """A Patroni cluster with FlowForge's schema, one bin/api and one bin/worker on it."""

    def __init__(self, cluster: PatroniCluster, amqp_url: str, prefix: str, logs: Path) -> None:
        _, key = migrated_database(cluster.url("postgres"), DB, "patroni")
        self.url = cluster.url(DB)
        env = process_env(self.url, amqp_url, prefix, LEASE_SECONDS="2")
        self.processes: list[Process] = []
        api, self.base = start_api(env, logs / "api.log")
        self.processes.append(api)
        self.processes.append(start_worker(env, logs / "worker.log"))
        Api(self.base, key).publish("t", NUMBERED)

    def rows(self, sql: str, params: dict[str, object] | None = None) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def settle(self) -> set[str]:
        """Wait until every execution succeeded; the ids present."""
        wait_for(
            lambda: not self.rows("SELECT 1 FROM executions WHERE status <> 'succeeded'"),
            timeout=90,
            interval=0.5,
            message="every execution to succeed",
        )
        return {row[0] for row in self.rows("SELECT id::text FROM executions")}

    def first_step_after(self, moment: float) -> float | None:
        """When the first step of an execution created after `moment` finished; None
        while there is none, or while no primary answers."""
        try:
            rows = self.rows(
                "SELECT min(s.finished_at) FROM steps s JOIN executions e"
                " ON e.id = s.execution_id WHERE e.created_at > to_timestamp(%(t)s)",
                {"t": moment},
            )
        except psycopg.OperationalError:
            return None
        at: datetime | None = rows[0][0]
        return at.timestamp() if at else None

    def stop(self) -> None:
        for proc in self.processes:
            proc.stop()


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PatroniCluster]:
    made = PatroniCluster(synchronous=request.param == "sync")
    yield made
    made.stop(keep=tmp_path / "cluster")


@pytest.mark.parametrize("cluster", ["async", "sync"], indirect=True)
def test_patroni_promotes_and_haproxy_follows_when_the_leader_is_lost(
    cluster: PatroniCluster, amqp_url: str, amqp_prefix: str, tmp_path: Path
) -> None:
    synchronous = cluster.synchronous
    running = Running(cluster, amqp_url, amqp_prefix, tmp_path)
    try:
        load = Load(running.base)
        wait_for(lambda: len(load.acked) >= 30, timeout=60, message="webhooks before")
        lost_node = cluster.leader()
        lost_node.kill()
        killed_at = time.time()
        try:
            back = wait_for(
                lambda: load.first_after(killed_at), timeout=90, interval=0.2, message="intake"
            )
        except AssertionError as exc:
            answers = load.answers(killed_at)
            raise AssertionError(f"{exc}; answers {answers}\n{cluster.describe()}") from None
        worked = wait_for(
            lambda: running.first_step_after(killed_at),
            timeout=90,
            interval=0.2,
            message="a step completed after the loss",
        )
        wait_for(lambda: len([t for t in load.acked.values() if t > back]) >= 20, timeout=60)
        load.finish()
        present = running.settle()
    finally:
        running.stop()
    lost = set(load.acked) - present
    mode = "synchronous_mode" if synchronous else "asynchronous"
    print(
        f"\n{mode}: leader lost; first 202 {back - killed_at:.1f} s and first completed step "
        f"{worked - killed_at:.1f} s after; {len(load.acked)} acknowledged, {len(lost)} lost"
    )
    assert cluster.leader() is not lost_node
    if synchronous:
        assert not lost


@pytest.mark.parametrize("cluster", ["async"], indirect=True)
def test_a_switchover_under_load_loses_nothing(
    cluster: PatroniCluster, amqp_url: str, amqp_prefix: str, tmp_path: Path
) -> None:
    running = Running(cluster, amqp_url, amqp_prefix, tmp_path)
    try:
        load = Load(running.base)
        wait_for(lambda: len(load.acked) >= 30, timeout=60, message="webhooks before")
        old = cluster.leader()
        asked_at = time.time()
        cluster.switchover()
        wait_for(lambda: cluster.leader() is not old, timeout=60, message="the new leader")
        wait_for(lambda: load.first_after(asked_at + 1), timeout=60, message="intake after")
        wait_for(lambda: len([t for t in load.acked.values() if t > asked_at]) >= 40, timeout=60)
        load.finish()
        present = running.settle()
    finally:
        running.stop()
    lost = set(load.acked) - present
    print(
        f"\nswitchover under load: longest gap between two 202s {load.longest_gap():.1f} s; "
        f"{len(load.acked)} acknowledged, {len(lost)} lost"
    )
    assert not lost
