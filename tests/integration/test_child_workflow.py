"""The workflow step (docs/contract.md#child-workflows, child workflows): the child's output
flows back, a failed child fails the step (and a retry starts a new child), cancelling the
parent cancels the child, a child that needs attention keeps its parent waiting visibly until
it is resolved, cycles are refused at publish and depth is bounded at run time. In the test's
process (`in_process`) where the point is the step's behaviour; through real bin/api and
bin/worker where it is steps running at once, the reconciler or a worker's own setting."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from flowforge.worker.retention import Retention
from tests.faults.helpers import cli
from tests.support import inprocess
from tests.support.api import Api, step
from tests.support.definitions import http, transform, unsigned
from tests.support.inprocess import InProcess
from tests.support.processes import Process, wait_for
from tests.support.target import Reply, Target


@pytest.fixture
def client(api: str, api_key: str, workers: Callable[..., Process]) -> Api:
    workers(FLOWFORGE_WORKER_CONCURRENCY="4")
    return Api(api, api_key)


def definition(*steps: dict[str, Any]) -> dict[str, Any]:
    return unsigned(list(steps))


def calls(workflow: str, step_id: str = "invoice", **fields: Any) -> dict[str, Any]:
    return {"id": step_id, "type": "workflow", "workflow": workflow, **fields}


def parent(child: str = "invoicing") -> dict[str, Any]:
    """Orders: starts `child` with part of its input, then shapes the child's output."""
    return definition(
        calls(child, input={"order": "{{ input.order }}", "lines": "{{ input.lines }}"}),
        {
            "id": "done",
            "type": "transform",
            "depends_on": ["invoice"],
            "output": {"invoice": "{{ invoice.number }}", "total": "{{ invoice.total }}"},
        },
    )


def ended(client: Api | InProcess, execution_id: str, status: str) -> dict[str, Any]:
    """The execution once it has ended, which it did with `status`."""
    execution = client.wait(execution_id, timeout=30)
    assert execution["status"] == status, execution
    return execution


def children(db: psycopg.Connection, parent_id: str) -> list[tuple[str, str, str, int]]:
    return [
        (str(r[0]), r[1], r[2], r[3])
        for r in db.execute(
            "SELECT id, parent_step, status, depth FROM executions"
            " WHERE parent_id = %s ORDER BY created_at",
            (parent_id,),
        ).fetchall()
    ]


def test_the_parent_starts_the_child_and_takes_its_output(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    in_process.publish(
        "invoicing",
        definition(
            {"id": "count", "type": "transform", "output": {"n": "{{ input.lines }}"}},
            {
                "id": "issue",
                "type": "transform",
                "depends_on": ["count"],
                "output": {"number": "inv-{{ input.order }}", "total": "{{ input.lines }}"},
            },
        ),
    )
    in_process.publish("orders", parent())
    eid = in_process.start("orders", {"order": "o-7", "lines": 3})
    done = ended(in_process, eid, "succeeded")
    # The child's output is its last step's output; the parent's next step reads it.
    assert step(done, "invoice")["output"] == {"number": "inv-o-7", "total": 3}
    assert step(done, "done")["output"] == {"invoice": "inv-o-7", "total": 3}
    [link] = done["children"]
    assert link["step_id"] == "invoice" and link["workflow"] == "invoicing"
    assert link["status"] == "succeeded"
    child = in_process.execution(link["execution_id"])
    assert child["parent"] == {"execution_id": eid, "step_id": "invoice"}
    assert child["depth"] == 1 and child["trigger"] == "workflow"
    assert child["input"] == {"order": "o-7", "lines": 3}
    assert done["parent"] is None and done["depth"] == 0
    # Its identity is a system key of the step's round: no client key can claim it.
    (origin, key) = db.execute(
        "SELECT origin, key FROM idempotency_keys WHERE execution_id = %s",
        (link["execution_id"],),
    ).fetchone()
    assert origin == "system" and key == f"child:{eid}:invoice:0"
    kinds = [e["kind"] for e in done["events"] if e["step"] == "invoice"]
    assert "child.started" in kinds and "child.ended" in kinds


def test_a_failed_child_fails_the_step_and_a_retry_starts_a_new_child(
    in_process: InProcess, target: Target, db: psycopg.Connection
) -> None:
    target.script = lambda _r: Reply(status=400, json={"error": "no"})
    in_process.publish(
        "invoicing",
        definition(http("post", "GET", f"{target.url}/invoice", retry={"max_attempts": 1})),
    )
    in_process.publish("orders", parent())
    eid = in_process.start("orders", {"order": "o-1", "lines": 1})
    failed = ended(in_process, eid, "failed")
    error = step(failed, "invoice")["error"]
    [(first, _, status, _)] = children(db, eid)
    assert status == "failed"
    assert f"child execution {first} of invoicing failed" in error and "400" in error
    assert step(failed, "done")["status"] == "cancelled"

    target.script = lambda _r: Reply(json={"number": "inv-1", "total": 1})
    in_process.publish(
        "invoicing",
        definition(
            http("post", "GET", f"{target.url}/invoice"),
            transform("shape", "{{ post.body }}", after=("post",)),
        ),
    )
    assert in_process.post(f"/api/v1/executions/{eid}/retry").status_code == 202
    done = ended(in_process, eid, "succeeded")
    assert step(done, "done")["output"] == {"invoice": "inv-1", "total": 1}
    # A new child for the new round, of the newest version; the failed one is kept.
    rows = children(db, eid)
    assert rows[0][0] == first and [r[2] for r in rows] == ["failed", "succeeded"]
    assert in_process.execution(rows[1][0])["version"] == 2


def test_cancelling_the_parent_cancels_the_child(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    in_process.publish(
        "invoicing", definition({"id": "approve", "type": "wait", "timeout_s": 3600})
    )
    in_process.publish("orders", parent())
    eid = in_process.start("orders", {"order": "o-2", "lines": 1})
    waiting = in_process.wait(eid, "waiting", timeout=30)
    child_id = step(waiting, "invoice")["output"]["execution_id"]
    in_process.wait(child_id, "waiting", timeout=30)
    assert in_process.post(f"/api/v1/executions/{eid}/cancel").status_code == 202
    assert in_process.wait(eid, timeout=30)["status"] == "cancelled"
    child = ended(in_process, child_id, "cancelled")
    assert step(child, "approve")["status"] == "cancelled"
    asked = [e for e in child["events"] if e["kind"] == "execution.cancel_requested"]
    assert asked[0]["detail"]["actor"]["name"] == "parent execution"


def test_a_child_that_needs_attention_keeps_the_parent_waiting_until_it_is_resolved(
    client: Api, target: Target, env: dict[str, str]
) -> None:
    # A POST with no idempotency key that times out after it was sent: unknown.
    target.script = lambda _r: Reply(json={"late": True}, delay_s=2.0)
    client.publish(
        "invoicing",
        definition(
            {
                "id": "post",
                "type": "http_request",
                "request": {"method": "POST", "url": f"{target.url}/issue", "timeout_s": 0.5},
            }
        ),
    )
    client.publish("orders", parent())
    eid = client.start("orders", {"order": "o-3", "lines": 2})
    child_id = wait_for(
        lambda: (client.execution(eid)["children"] or [{}])[0].get("execution_id"),
        timeout=30,
        message="the child to start",
    )
    client.wait(child_id, "needs_attention", timeout=30)

    def says_why() -> dict[str, Any] | None:
        now = client.execution(eid)
        error = step(now, "invoice")["error"] or ""
        return now if "needs attention" in error else None

    held = wait_for(says_why, timeout=30, message="the parent to say why it waits")
    # Waiting, not failed; the step says on which child, and the child says why.
    assert held["status"] == "waiting"
    assert step(held, "invoice")["status"] == "waiting"
    assert child_id in step(held, "invoice")["error"]
    assert held["children"][0]["status"] == "needs_attention"
    assert any(e["kind"] == "child.needs_attention" for e in held["events"])
    [why] = held["waiting_on_children"]
    assert why["execution_id"] == child_id and why["needs_attention"] is True
    shown = cli(env, "executions", "show", eid)
    assert f"waits on child {child_id}, which needs attention" in shown.stdout, shown.stderr

    resolved = client.post(
        f"/api/v1/executions/{child_id}/steps/post/resolve",
        {"outcome": "succeeded", "output": {"number": "inv-3", "total": 2}},
    )
    assert resolved.status_code == 200, resolved.text
    done = client.wait(eid, {"succeeded", "failed", "cancelled"}, timeout=30)
    assert done["status"] == "succeeded", done
    # The child's last step output is what the operator said; the parent reads from it.
    assert step(done, "invoice")["output"] == {"number": "inv-3", "total": 2}
    assert step(done, "invoice")["error"] is None
    assert step(done, "done")["output"] == {"invoice": "inv-3", "total": 2}
    assert done["waiting_on_children"] == []


def test_a_cycle_of_workflows_is_refused_at_publish_naming_its_path(in_process: InProcess) -> None:
    itself = in_process.post("/api/v1/workflows/loop/versions", definition(calls("loop", "again")))
    assert itself.status_code == 422
    assert itself.headers["Content-Type"].startswith("application/problem+json")
    [error] = itself.json()["errors"]
    assert error["path"] == "$.steps[0].workflow"
    assert "loop -> loop" in error["message"]

    in_process.publish("a", definition(calls("b", "to_b")))
    in_process.publish("b", definition(calls("c", "to_c")))
    closing = in_process.post(
        "/api/v1/workflows/c/versions",
        definition({"id": "x", "type": "transform", "output": {}}, calls("a", "to_a")),
    )
    assert closing.status_code == 422, closing.text
    [error] = closing.json()["errors"]
    assert error["path"] == "$.steps[1].workflow"
    assert "c -> a -> b -> c" in error["message"]
    # Nothing was written: c has no version.
    assert in_process.app.get("/api/v1/workflows/c").status_code == 404


def test_depth_is_bounded_at_run_time(
    api: str, api_key: str, workers: Callable[..., Process]
) -> None:
    workers(FLOWFORGE_MAX_CHILD_DEPTH="2")
    client = Api(api, api_key)
    client.publish("w3", definition(calls("w4", "deeper")))
    client.publish("w2", definition(calls("w3", "deeper")))
    client.publish("w1", definition(calls("w2", "deeper")))
    eid = client.start("w1", {})
    done = ended(client, eid, "failed")
    w2 = client.execution(done["children"][0]["execution_id"])
    w3 = client.execution(w2["children"][0]["execution_id"])
    assert (w2["depth"], w3["depth"]) == (1, 2)
    # w3's step would start a child at depth 3: refused, saying why; no such child exists.
    assert w3["children"] == []
    assert "FLOWFORGE_MAX_CHILD_DEPTH 2" in step(w3, "deeper")["error"]
    assert "failed" in step(done, "deeper")["error"]


def test_a_concurrency_limited_child_queues_behind_the_other_and_both_parents_succeed(
    client: Api, target: Target, db: psycopg.Connection
) -> None:
    # Each child holds the target for a while: with a limit of 1, the second waits queued.
    target.script = lambda _r: Reply(json={"number": "inv", "total": 1}, delay_s=1.5)
    client.publish(
        "invoicing",
        {
            **definition(
                {
                    "id": "post",
                    "type": "http_request",
                    "request": {"method": "POST", "url": f"{target.url}/invoice"},
                    "retry": {"max_attempts": 1},
                },
                {
                    "id": "shape",
                    "type": "transform",
                    "depends_on": ["post"],
                    "output": "{{ post.body }}",
                },
            ),
            "concurrency": {"limit": 1},
        },
    )
    client.publish("orders", parent())
    first = client.start("orders", {"order": "o-1", "lines": 1})
    second = client.start("orders", {"order": "o-2", "lines": 1})

    def one_queued() -> dict[str, Any] | None:
        for eid in (first, second):
            shown = client.execution(eid)
            waits = shown["waiting_on_children"]
            if waits and waits[0]["status"] == "queued" and waits[0]["waiting_for_slot"]:
                return shown
        return None

    # While one child runs, the other parent waits on a child that waits for its slot.
    queued = wait_for(one_queued, timeout=30)
    assert step(queued, "invoice")["status"] == "waiting"
    for eid in (first, second):
        done = client.wait(eid, timeout=60)
        assert done["status"] == "succeeded", done
        assert step(done, "done")["output"] == {"invoice": "inv", "total": 1}
    rows = db.execute(
        "SELECT slot_at, finished_at, concurrency_key FROM executions"
        " WHERE parent_id = ANY(%s::uuid[]) ORDER BY slot_at",
        ([first, second],),
    ).fetchall()
    assert len(rows) == 2 and all(r[2] == "" for r in rows)
    # One at a time: the second took its slot once the first had ended.
    assert rows[1][0] >= rows[0][1]
    assert len(target.received) == 2


def _second_order_on_a_full_child(client: Api | InProcess, on_full: str) -> tuple[str, str, str]:
    """Invoicing takes one child at a time (`on_full` past that); the first order's child
    waits, holding the slot, when the second order starts. Returns the first order, its
    child and the second order."""
    client.publish(
        "invoicing",
        {
            **definition({"id": "approve", "type": "wait", "timeout_s": 3600}),
            "concurrency": {"limit": 1, "on_full": on_full},
        },
    )
    client.publish("orders", parent())
    first = client.start("orders", {"order": "o-1", "lines": 1})
    holder = step(client.wait(first, "waiting", timeout=30), "invoice")["output"]["execution_id"]
    client.wait(holder, "waiting", timeout=30)
    return first, holder, client.start("orders", {"order": "o-2", "lines": 1})


def test_a_child_dropped_by_drop_new_fails_its_parents_step_saying_why(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    first, _holder, second = _second_order_on_a_full_child(in_process, "drop_new")
    failed = ended(in_process, second, "failed")
    error = step(failed, "invoice")["error"]
    [(dropped, _, status, _)] = children(db, second)
    assert status == "cancelled"
    assert f"child execution {dropped} of invoicing cancelled" in error, error
    assert "concurrency limit reached (on_full drop_new)" in error, error
    assert step(failed, "done")["status"] == "cancelled"
    # The first parent's child holds its slot, untouched; no retry loop starts more.
    assert in_process.execution(first)["status"] == "waiting"
    assert [c[2] for c in children(db, first)] == ["waiting"]
    assert len(children(db, second)) == 1


def test_a_child_refused_by_max_queued_fails_its_parents_step_saying_why(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    in_process.publish(
        "invoicing",
        {
            **definition({"id": "approve", "type": "wait", "timeout_s": 3600}),
            "concurrency": {"limit": 1, "max_queued": 1},
        },
    )
    in_process.publish("orders", parent())
    first = in_process.start("orders", {"order": "o-1", "lines": 1})
    in_process.wait(first, "waiting", timeout=30)
    second = in_process.start("orders", {"order": "o-2", "lines": 1})
    # The second's child waits in the queue (the one place max_queued allows).
    in_process.wait(second, "waiting", timeout=30)
    assert [c[2] for c in children(db, second)] == ["queued"]
    third = in_process.start("orders", {"order": "o-3", "lines": 1})
    failed = ended(in_process, third, "failed")
    error = step(failed, "invoice")["error"]
    assert "concurrency.max_queued" in error, error
    assert in_process.execution(second)["status"] == "waiting"


def test_a_child_says_when_retention_deleted_its_parent(
    in_process: InProcess, db: psycopg.Connection, database_url: str
) -> None:
    in_process.publish(
        "invoicing",
        definition({"id": "issue", "type": "transform", "output": {"number": 9, "total": 1}}),
    )
    in_process.publish("orders", {**parent(), "retention_days": 0.001})
    eid = in_process.start("orders", {"order": "o-9", "lines": 1})
    assert in_process.wait(eid, timeout=30)["status"] == "succeeded"
    [(child_id, _, _, _)] = children(db, eid)
    shown = in_process.execution(child_id)
    assert shown["parent"] == {"execution_id": eid, "step_id": "invoice"}
    assert shown["parent_deleted"] is False
    # The parent's workflow keeps its executions for minutes, the child's for days.
    db.execute(
        "UPDATE executions SET finished_at = now() - interval '1 hour' WHERE id = %s", (eid,)
    )
    with inprocess.pool(database_url, "test-retention") as pool:
        Retention(pool, threading.Event()).expire()
    assert db.execute("SELECT 1 FROM executions WHERE id = %s", (eid,)).fetchone() is None
    shown = in_process.execution(child_id)
    # The link stays as recorded, and says its other end is gone.
    assert shown["parent"] == {"execution_id": eid, "step_id": "invoice"}
    assert shown["parent_deleted"] is True
    assert in_process.execution(child_id)["status"] == "succeeded"


def test_a_child_under_cancel_oldest_replaces_the_older_child_whose_parent_fails(
    client: Api, db: psycopg.Connection
) -> None:
    first, older, second = _second_order_on_a_full_child(client, "cancel_oldest")
    # The older child is stopped (the reconciler stops surplus holders): its parent fails.
    failed = ended(client, first, "failed")
    assert f"child execution {older} of invoicing cancelled" in step(failed, "invoice")["error"]
    # The newer child takes the slot and runs; its parent waits on it.
    [(newer, _, _, _)] = children(db, second)
    assert client.wait(newer, "waiting", timeout=30)["status"] == "waiting"
    assert client.execution(second)["status"] == "waiting"
    (reason,) = db.execute("SELECT stop_reason FROM executions WHERE id = %s", (older,)).fetchone()
    assert reason == "concurrency"
