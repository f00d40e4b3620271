"""Child workflow fan-out is bounded per root (docs/reference/definition.md, workflow
steps): through real bin/api and bin/worker processes, a webhook whose workflow starts 5
children that each start 5 more would make 30 descendants; with
FLOWFORGE_MAX_DESCENDANTS=12 exactly 12 exist, and the first workflow step past the cap
fails saying why, so the root ends failed instead of multiplying without end. A child of
a workflow with `max_queued` is counted by that queue like any execution of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from tests.support.api import Api
from tests.support.definitions import unsigned
from tests.support.processes import Process, wait_for

FAN = 5
CAP = 12


def definition(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return unsigned(list(steps), **extra)


def fan(workflow: str) -> dict[str, Any]:
    return definition(
        *({"id": f"c{n}", "type": "workflow", "workflow": workflow} for n in range(FAN))
    )


def test_the_descendants_of_one_root_are_capped(
    api: str, api_key: str, db: psycopg.Connection, workers: Callable[..., Process]
) -> None:
    client = Api(api, api_key)
    client.publish("leaf", definition({"id": "keep", "type": "transform", "output": {"n": 1}}))
    client.publish("mid", fan("leaf"))
    client.publish("root", fan("mid"))
    # Two workers of 4 threads: parents of one tree start children at the same time.
    workers(FLOWFORGE_MAX_DESCENDANTS=str(CAP), FLOWFORGE_WORKER_CONCURRENCY="4")
    workers(FLOWFORGE_MAX_DESCENDANTS=str(CAP), FLOWFORGE_WORKER_CONCURRENCY="4")
    eid = client.start("root", {})
    done = client.wait(eid, timeout=90)
    assert done["status"] == "failed", done
    total = db.execute("SELECT count(*) FROM executions").fetchone()[0]
    assert total == 1 + CAP
    refused = db.execute(
        "SELECT count(*) FROM steps WHERE type = 'workflow' AND status = 'failed'"
        " AND error LIKE %s",
        ("%FLOWFORGE_MAX_DESCENDANTS 12%",),
    ).fetchone()[0]
    # 30 workflow steps would start a child; 12 did. The first refused fails saying why
    # (its execution then fails, and the steps it had not started are cancelled).
    assert refused >= 1
    wait_for(
        lambda: (
            db.execute(
                "SELECT count(*) FROM executions WHERE status NOT IN "
                "('succeeded', 'failed', 'cancelled')"
            ).fetchone()[0]
            == 0
        ),
        timeout=60,
        message="every execution of the tree to end",
    )


def test_children_count_in_their_workflows_max_queued(
    api: str, api_key: str, db: psycopg.Connection, workers: Callable[..., Process]
) -> None:
    client = Api(api, api_key)
    slow = {"id": "wait", "type": "delay", "duration_s": 30}
    client.publish("gated", definition(slow, concurrency={"limit": 1, "max_queued": 2}))
    client.publish("root", fan("gated"))
    workers()
    eid = client.start("root", {})
    done = client.wait(eid, timeout=60)
    assert done["status"] == "failed", done
    refused = db.execute(
        "SELECT count(DISTINCT execution_id) FROM steps WHERE error LIKE %s",
        ("%concurrency.max_queued%",),
    ).fetchone()[0]
    # At most one holds the slot and two wait in the queue: the others were refused by
    # max_queued (written cancelled, saying why, and their parent's steps fail on them).
    assert refused >= FAN - 3
