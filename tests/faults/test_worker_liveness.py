"""Worker liveness (issue 26): a SIGKILLed worker's steps are recovered within seconds
although their lease is long, and a live worker keeps a lease through a request slower
than the liveness timeout. Leases are 120 s here; recovery by lease alone would take
that long. Runtime: about 40 s."""

from __future__ import annotations

import time

import psycopg

from flowforge.domain.model import WORKER_DEAD_AFTER_S
from tests.faults.helpers import StartWorker, scalar, step_status
from tests.support.api import Api, step
from tests.support.definitions import http, workflow
from tests.support.processes import wait_for
from tests.support.target import Received, Reply, Target

LONG_LEASE = {"FLOWFORGE_LEASE_SECONDS": "120"}


def test_a_killed_workers_long_lease_is_reclaimed_in_seconds(
    client: Api, db: psycopg.Connection, workers: StartWorker, target: Target
) -> None:
    target.script = lambda _r: Reply(json={"ok": True}, delay_s=300)  # hangs
    doomed = workers(**LONG_LEASE)
    client.publish("slow", workflow(http("call", "GET", f"{target.url}/slow")))
    eid = client.start("slow", {})
    wait_for(lambda: step_status(db, eid, "call") == "running", timeout=30, message="the claim")
    doomed.kill()
    killed_at = time.monotonic()
    workers(**LONG_LEASE)  # the survivor, whose reaper notices the silence
    wait_for(
        lambda: step_status(db, eid, "call") != "running",
        timeout=60,
        message="the dead worker's step to be recovered",
    )
    recovered_s = time.monotonic() - killed_at
    print(f"\nSIGKILLed worker's 120 s lease recovered {recovered_s:.1f} s after the kill")
    assert recovered_s < 120
    owners = scalar(db, "SELECT count(*) FROM worker_heartbeats")
    assert owners == 1  # the dead one's row is gone, the survivor's is there


def test_a_live_worker_keeps_its_lease_through_a_slow_request(
    client: Api, workers: StartWorker, target: Target
) -> None:
    slow_s = WORKER_DEAD_AFTER_S + 4

    def reply(_r: Received) -> Reply:
        return Reply(json={"ok": True}, delay_s=slow_s)

    target.script = reply
    worker = workers(**LONG_LEASE)
    workers(**LONG_LEASE)  # another reaper, watching
    client.publish("slow", workflow(http("call", "GET", f"{target.url}/slow")))
    done = client.wait(client.start("slow", {}), timeout=60)
    assert done["status"] == "succeeded", done
    assert len(step(done, "call")["attempts"]) == 1
    assert len(target.requests_to("/slow")) == 1
    assert "lease lost" not in worker.log()
