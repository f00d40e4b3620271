"""Case 5: an hours-long delay.

Promise: a delay is a row in PostgreSQL (`waiting` with `wake_at`), never a sleeping
thread. It survives having no worker at all; a worker started after it fell due finishes
it at once; and ten thousand sleeping delays cost a worker no threads and no memory.
Instead of waiting two hours the tests shift the row's `wake_at` in the database.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from tests.faults.helpers import StartWorker, proc_status, scalar
from tests.support.api import Api, step
from tests.support.definitions import http, workflow
from tests.support.target import Target

TWO_HOURS = 7200
SLEEPERS = 10_000

MAKE_DUE = """
UPDATE steps SET wake_at = now() - interval '1 second'
WHERE execution_id = ANY(%(ids)s) AND step_id = 'cool_off' AND status = 'waiting'
"""


def _cool_off_workflow(target: Target) -> dict:
    return workflow(
        {"id": "cool_off", "type": "delay", "duration_s": TWO_HOURS},
        http("after", "GET", f"{target.url}/after/{{{{ execution.id }}}}", after=("cool_off",)),
    )


def test_a_two_hour_delay_outlives_its_worker_and_finishes_once_due(
    client: Api, db: psycopg.Connection, workers: StartWorker, target: Target
) -> None:
    client.publish("slow", _cool_off_workflow(target))
    first = workers()
    eid = client.start("slow", {})
    waiting = client.wait(eid, "waiting")
    delay = step(waiting, "cool_off")
    assert delay["status"] == "waiting"
    assert scalar(
        db,
        "SELECT wake_at - now() > interval '1 hour 59 minutes' FROM steps "
        "WHERE execution_id = %(id)s AND step_id = 'cool_off'",
        {"id": eid},
    )
    assert first.stop() == 0  # no worker runs while the delay falls due

    assert db.execute(MAKE_DUE, {"ids": [eid]}).rowcount == 1
    time.sleep(1.0)
    assert client.execution(eid)["status"] == "waiting"  # nobody is there to wake it
    assert target.received == []

    started = time.monotonic()
    workers()
    done = client.wait(eid, timeout=30)
    elapsed = time.monotonic() - started
    assert done["status"] == "succeeded", done
    assert step(done, "cool_off")["status"] == "succeeded"
    assert [r.path for r in target.received] == [f"/after/{eid}"]
    print(f"due delay finished {elapsed:.2f} s after a fresh worker started")


# Ten thousand executions parked on a two-hour delay, written the way intake and the
# worker leave them: execution waiting, the delay waiting with wake_at, the next step
# pending. One statement, so the test measures the worker and not the webhook path.
PARK_SLEEPERS = """
WITH v AS (
    SELECT w.id AS workflow_id, v.id AS version_id
    FROM workflows w JOIN workflow_versions v ON v.workflow_id = w.id
    WHERE w.key = 'slow'
), made AS (
    INSERT INTO executions (id, workflow_id, version_id, status, input, started_at)
    SELECT gen_random_uuid(), v.workflow_id, v.version_id, 'waiting', '{}'::jsonb, now()
    FROM v, generate_series(1, %(n)s)
    RETURNING id
), delays AS (
    INSERT INTO steps (execution_id, step_id, type, position, status, attempts, wake_at,
                       started_at)
    SELECT id, 'cool_off', 'delay', 1, 'waiting', 0, now() + interval '2 hours', now()
    FROM made
)
INSERT INTO steps (execution_id, step_id, type, position, status)
SELECT id, 'after', 'http_request', 2, 'pending' FROM made
"""


@pytest.mark.slow
def test_ten_thousand_waiting_delays_hold_no_threads_and_no_memory(
    client: Api, db: psycopg.Connection, workers: StartWorker, target: Target
) -> None:
    client.publish("slow", _cool_off_workflow(target))
    worker = workers()
    # Warm up: one execution through every component, so lazily started threads exist.
    warm = client.start("slow", {})
    client.wait(warm, "waiting")
    db.execute(MAKE_DUE, {"ids": [warm]})
    assert client.wait(warm, timeout=30)["status"] == "succeeded"
    time.sleep(2.0)
    idle = proc_status(worker.pid)

    db.execute(PARK_SLEEPERS, {"n": SLEEPERS})
    assert scalar(db, "SELECT count(*) FROM steps WHERE status = 'waiting'") == SLEEPERS
    time.sleep(5.0)  # several timer scans, reaper and reconciler passes over the sleepers
    loaded = proc_status(worker.pid)
    print(
        f"idle worker: {idle['Threads']} threads, {idle['VmRSS'] / 1024:.1f} MB RSS; "
        f"with {SLEEPERS} waiting delays: {loaded['Threads']} threads, "
        f"{loaded['VmRSS'] / 1024:.1f} MB RSS"
    )
    assert loaded["Threads"] == idle["Threads"]
    assert loaded["VmRSS"] - idle["VmRSS"] < 50 * 1024
    assert scalar(db, "SELECT count(*) FROM steps WHERE status = 'waiting'") == SLEEPERS
    assert scalar(db, "SELECT count(*) FROM outbox") == 0

    # The worker is awake and watching all of them: three fall due and only those run.
    due = [
        str(r[0])
        for r in db.execute(
            "SELECT execution_id FROM steps WHERE status = 'waiting' LIMIT 3"
        ).fetchall()
    ]
    db.execute(MAKE_DUE, {"ids": due})
    for eid in due:
        assert client.wait(eid, timeout=30)["status"] == "succeeded"
    assert sorted(r.path for r in target.requests_to("/after/")) == sorted(
        f"/after/{eid}" for eid in [*due, warm]
    )
    assert scalar(db, "SELECT count(*) FROM steps WHERE status = 'waiting'") == SLEEPERS - 3
    assert worker.popen.poll() is None
