"""Failover of PostgreSQL under load (issue 26): a throwaway primary and its streaming
standby; bin/api and bin/worker use one multi-host URL (target_session_attrs=read-write).
The primary is SIGKILLed while webhooks arrive and the standby is promoted: intake and
work come back without a restart. With synchronous replication no acknowledged webhook is
lost; with asynchronous replication some may be, and the test prints how many (the
contract in docs/howto/several-hosts.md). Runtime: about 40 s per mode."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest
import requests

from tests.support.api import Api
from tests.support.definitions import NUMBERED
from tests.support.processes import (
    process_env,
    start_api,
    start_worker,
    wait_for,
)
from tests.support.replication import Replicated, migrated_database

DB = "ff_failover"


class Load:
    """Posts webhooks one after another; remembers which were acknowledged, and when."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.acked: dict[str, float] = {}  # execution id -> monotonic time of the 202
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                r = requests.post(f"{self.base}/hooks/t", json={"n": n}, timeout=5)
            except requests.RequestException:
                time.sleep(0.05)
                continue
            if r.status_code == 202:
                self.acked[r.json()["execution_id"]] = time.monotonic()
            else:
                time.sleep(0.05)

    def first_after(self, moment: float) -> float | None:
        later = [t for t in list(self.acked.values()) if t > moment]
        return min(later) if later else None


@pytest.mark.parametrize("synchronous", [False, True], ids=["async", "sync"])
def test_intake_and_work_come_back_after_a_promotion(
    synchronous: bool, amqp_url: str, amqp_prefix: str, tmp_path: Path
) -> None:
    pair = Replicated(synchronous)
    try:
        _, key = migrated_database(pair.primary.url, DB, "failover")
        env = process_env(pair.url(DB), amqp_url, amqp_prefix, LEASE_SECONDS="2")
        api_proc, base = start_api(env, tmp_path / "api.log")
        worker = start_worker(env, tmp_path / "worker.log")
        try:
            Api(base, key).publish("t", NUMBERED)
            load = Load(base)
            wait_for(lambda: len(load.acked) >= 30, timeout=60, message="webhooks before")
            killed_at = pair.fail_over()
            back = wait_for(lambda: load.first_after(killed_at), timeout=60, message="intake back")
            wait_for(lambda: len([t for t in load.acked.values() if t > back]) >= 10, timeout=60)
            load.stop.set()
            load.thread.join(10)
            new_primary = psycopg.conninfo.make_conninfo(pair.standby.url, dbname=DB)
            with psycopg.connect(new_primary, autocommit=True) as conn:

                def unfinished() -> set[str]:
                    rows = conn.execute("SELECT id::text, status FROM executions").fetchall()
                    return {eid for eid, status in rows if status != "succeeded"}

                settled = wait_for(
                    lambda: not unfinished() or None,
                    timeout=60,
                    interval=0.5,
                    message="every execution on the new primary to succeed",
                )
                present = {r[0] for r in conn.execute("SELECT id::text FROM executions")}
                worked = conn.execute("SELECT max(finished_at) FROM executions").fetchone()
            lost = set(load.acked) - present
            mode = "synchronous" if synchronous else "asynchronous"
            print(
                f"\n{mode}: intake back {back - killed_at:.2f} s after the kill; "
                f"{len(load.acked)} acknowledged, {len(lost)} lost; all present succeeded"
            )
            assert settled and worked
            if synchronous:
                assert not lost
        finally:
            worker.stop()
            api_proc.stop()
    finally:
        pair.stop()
