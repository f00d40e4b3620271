"""Lease recovery and the reconciler never wait behind housekeeping (docs/contract.md#lost-messages,
docs/contract.md#retention).

Against a real bin/worker whose housekeeping pass is stalled at the fault point
`housekeeping_keys` — inside its pass, holding its pooled connection, with expired
idempotency keys still to delete — for far longer than the test runs: a lease that
expires meanwhile is recovered, and a ready step whose wake-up was lost is re-dispatched
and runs. SIGTERM still drains the worker at once: the stall, like every batch of
housekeeping, ends when its loop is told to stop.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg

from tests.faults.helpers import StartWorker, logged, scalar, wait_logged
from tests.support.definitions import unsigned
from tests.support.processes import wait_for

# Far longer than the test: the pass is provably still stalled when recovery happens.
STALL = "housekeeping_keys=sleep:600"
EXPIRED_KEYS = 50
PAY = unsigned(
    [
        {
            "id": "charge",
            "type": "http_request",
            "request": {"method": "POST", "url": "http://127.0.0.1:9/charge"},
        }
    ],
    name="pay",
)
SHAPE = unsigned([{"id": "shape", "type": "transform", "output": {"x": "{{ input.x }}"}}])
# A worker's claim as it commits it — running, a started attempt of a POST, a lease —
# held by a worker that is gone; the lease runs out only when the test says so.
CLAIMED_BY_A_DEAD_WORKER = """
WITH s AS (
    UPDATE steps SET status = 'running', fencing_token = 1, attempts = 1, lease_owner = 'dead',
                     started_at = now(), ready_at = NULL,
                     lease_expires_at = now() + interval '1 hour'
    WHERE execution_id = %(id)s
)
INSERT INTO attempts (execution_id, step_id, attempt, fencing_token, worker)
VALUES (%(id)s, 'charge', 1, 1, 'dead')
"""
EXPIRED = """
INSERT INTO idempotency_keys (workflow_id, key, body_sha256, execution_id, created_at)
SELECT w.id, 'old-' || n, '\\x00', gen_random_uuid(), now() - interval '25 hours'
FROM generate_series(1, %(n)s) AS n, (SELECT min(id) AS id FROM workflows) AS w
"""


def start(client: Any, workflow: str) -> str:
    response = client.post(f"/hooks/{workflow}", json={"x": 1})
    assert response.status_code == 202, response.get_json()
    return str(response.get_json()["execution_id"])


def status(db: psycopg.Connection, table: str, eid: str) -> str:
    column = "id" if table == "executions" else "execution_id"
    return scalar(db, f"SELECT status FROM {table} WHERE {column} = %(id)s", {"id": eid})


def test_recovery_and_reconciling_go_on_while_housekeeping_is_stalled_in_its_pass(
    open_client: Any, db: psycopg.Connection, workers: StartWorker
) -> None:
    for key, definition in (("pay", PAY), ("shape", SHAPE)):
        published = open_client.post(f"/api/v1/workflows/{key}/versions", json=definition)
        assert published.status_code == 201, published.get_json()
    charged, shaped = start(open_client, "pay"), start(open_client, "shape")
    db.execute(CLAIMED_BY_A_DEAD_WORKER, {"id": charged})
    # Its wake-up is yet to be lost: for now the step waits, with no message to lose.
    db.execute(
        "UPDATE steps SET status = 'pending', ready_at = NULL WHERE execution_id = %s", (shaped,)
    )
    db.execute("DELETE FROM outbox")
    db.execute(EXPIRED, {"n": EXPIRED_KEYS})

    worker = workers(FLOWFORGE_FAULTS=STALL)
    stalled = wait_logged(worker, "fault point reached")
    assert [r.get("fault") for r in stalled] == ["housekeeping_keys"]

    # Now, with housekeeping in its pass: the dead worker's lease runs out, and the
    # ready step's wake-up is lost (ready for a while, no outbox row, no message).
    db.execute(
        "UPDATE steps SET lease_expires_at = now() - interval '1 second' WHERE execution_id = %s",
        (charged,),
    )
    db.execute(
        "UPDATE steps SET status = 'ready', ready_at = now() - interval '1 minute' "
        "WHERE execution_id = %s",
        (shaped,),
    )
    wait_for(
        lambda: status(db, "executions", charged) == "needs_attention",
        timeout=30,
        message="the expired lease to be recovered",
    )
    assert status(db, "steps", charged) == "unknown"  # a POST that may have left: not re-sent
    wait_for(
        lambda: status(db, "executions", shaped) == "succeeded",
        timeout=30,
        message="the lost wake-up to be re-dispatched and run",
    )

    # Housekeeping is still where it stalled: not one expired key forgotten yet.
    assert (
        scalar(db, "SELECT count(*) FROM idempotency_keys WHERE key LIKE 'old-%%'") == EXPIRED_KEYS
    )
    assert logged(worker, "forgot old idempotency keys") == []

    # SIGTERM drains at once: the stall ends with its loop, nothing is left running.
    worker.signal(signal.SIGTERM)
    assert worker.popen.wait(timeout=60) == 0
    assert logged(worker, "worker stopped")
    assert logged(worker, "services still running at exit") == []
