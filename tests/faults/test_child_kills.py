"""A workflow step's child (docs/contract.md#child-workflows) is created exactly once, however the
worker dies.

The child is written in the transaction that moves the parent's step to `waiting`, under a
system idempotency key of the step's round. A worker SIGKILLed inside that transaction
(after the child's rows were written, before the commit) leaves neither: the next worker
starts the step again and creates the one child; one killed right after the commit leaves
both, and the step's wake-up delivered again finds it waiting on that child. A worker
SIGKILLed while the parent waits (its child's request in flight) leaves the child to be
recovered like any execution, and the child's end still wakes the parent.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from tests.faults.helpers import StartWorker
from tests.support.api import Api, step
from tests.support.definitions import http, transform, workflow
from tests.support.processes import wait_for
from tests.support.target import Received, Reply, Target


def _publish(client: Api, target: Target) -> None:
    client.publish(
        "invoicing",
        workflow(
            http(
                "issue",
                "GET",
                f"{target.url}/issue/{{{{ input.order }}}}",
                retry={"max_attempts": 5, "initial_interval_s": 0.2},
            ),
            transform("shape", "{{ issue.body }}", after=("issue",)),
        ),
    )
    client.publish(
        "orders",
        workflow(
            {"id": "invoice", "type": "workflow", "workflow": "invoicing", "input": "{{ input }}"},
            transform("done", "{{ invoice }}", after=("invoice",)),
        ),
    )


def _children(db: psycopg.Connection, parent_id: str) -> list[Any]:
    return db.execute(
        "SELECT id, status FROM executions WHERE parent_id = %s", (parent_id,)
    ).fetchall()


def _killed_at(fault: str, order: str, client: Api, workers: StartWorker, target: Target) -> str:
    """Start an order under a worker armed to die at `fault`; its execution once it died."""
    target.script = lambda r: Reply(json={"invoice": r.path.rsplit("/", 1)[1]})
    _publish(client, target)
    doomed = workers(FLOWFORGE_FAULTS=f"{fault}=kill")
    eid = client.start("orders", {"order": order})
    wait_for(lambda: doomed.popen.poll() is not None, timeout=30, message="the kill")
    assert fault in doomed.log()
    return eid


def _next_worker_finishes(client: Api, workers: StartWorker, eid: str, order: str) -> None:
    """A fresh worker takes over and the parent ends with its child's invoice."""
    workers()
    done = client.wait(eid, timeout=60)
    assert done["status"] == "succeeded", done
    assert step(done, "done")["output"] == {"invoice": order}


def test_a_kill_inside_the_transaction_that_creates_the_child_leaves_one_child(
    client: Api, workers: StartWorker, target: Target, db: psycopg.Connection
) -> None:
    eid = _killed_at("after_child_created", "o-1", client, workers, target)
    # Rolled back with the step: no child, the step still ready.
    assert _children(db, eid) == []
    _next_worker_finishes(client, workers, eid, "o-1")
    [(_, status)] = _children(db, eid)
    assert status == "succeeded"
    assert len(target.requests_to("/issue/")) == 1


def test_a_kill_right_after_the_child_committed_leaves_the_parent_waiting_on_that_child(
    client: Api, workers: StartWorker, target: Target, db: psycopg.Connection
) -> None:
    eid = _killed_at("after_child_committed", "o-3", client, workers, target)
    [(child_id, _)] = _children(db, eid)
    assert client.execution(eid)["status"] == "waiting"
    _next_worker_finishes(client, workers, eid, "o-3")
    # The same child: the step's wake-up, delivered again, found it waiting.
    assert [row[0] for row in _children(db, eid)] == [child_id]


def test_a_kill_while_the_parent_waits_still_ends_with_one_child_and_the_parent_done(
    client: Api, workers: StartWorker, target: Target, db: psycopg.Connection
) -> None:
    arrived = threading.Event()

    def script(request: Received) -> Reply:
        arrived.set()
        return Reply(json={"invoice": request.path.rsplit("/", 1)[1]}, delay_s=1.0)

    target.script = script
    _publish(client, target)
    first = workers()
    eid = client.start("orders", {"order": "o-2"})
    assert arrived.wait(30), "the child's request never arrived"
    first.kill()
    assert client.execution(eid)["status"] == "waiting"
    _next_worker_finishes(client, workers, eid, "o-2")
    [(_, status)] = _children(db, eid)
    assert status == "succeeded"
    # The GET was repeated by the next owner of the child's step (safe to repeat).
    assert len(target.requests_to("/issue/")) >= 2
