"""Parent and child (docs/contract.md#child-workflows) link both ways where an operator looks: the
API's JSON, the console's execution page and `flowforge executions show`; and the child's end writes
its parent's wake-up in the child's own transaction (the reconciler writes a lost one
again)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from flowforge.worker.broker import Wakeup
from flowforge.worker.reconciler import Reconciler
from flowforge.worker.retention import Retention
from tests.faults.helpers import cli
from tests.integration.test_console import _sign_in
from tests.support import inprocess
from tests.support.definitions import unsigned


def test_parent_and_child_link_both_ways_in_the_api_the_console_and_the_cli(
    app_client: Any, api_key: str, database_url: str, db: psycopg.Connection, env: dict[str, str]
) -> None:
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    child_def = unsigned([{"id": "shape", "type": "transform", "output": {"n": "{{ input.n }}"}}])
    parent_def = unsigned(
        [{"id": "invoice", "type": "workflow", "workflow": "invoicing", "input": "{{ input }}"}]
    )
    parent_def["retention_days"] = 0.001  # minutes, the child's days: the parent goes first
    for key, document in (("invoicing", child_def), ("orders", parent_def)):
        assert (
            app_client.post(f"/api/v1/workflows/{key}/versions", json=document).status_code == 201
        )
    eid = app_client.post("/hooks/orders", json={"n": 5}).get_json()["execution_id"]
    with inprocess.executor(
        database_url, "test-console-children", worker_id="worker-children"
    ) as executor:
        executor.handle(Wakeup(eid, "invoice"))
        waiting = app_client.get(f"/api/v1/executions/{eid}").get_json()
        assert waiting["status"] == "waiting"
        child_id = waiting["steps"][0]["output"]["execution_id"]
        db.execute("DELETE FROM outbox")
        executor.handle(Wakeup(child_id, "shape"))
        # The child's end committed with its parent's wake-up.
        woken = db.execute("SELECT execution_id::text, step_id FROM outbox").fetchall()
        assert (eid, "invoice") in woken
        # Lost anyway (a purged queue): the reconciler writes it again.
        db.execute("DELETE FROM outbox")
        Reconciler(executor.pool, reconcile_s=0.0).reconcile()
        woken = db.execute("SELECT execution_id::text, step_id FROM outbox").fetchall()
        assert woken == [(eid, "invoice")]
        executor.handle(Wakeup(eid, "invoice"))
    detail = app_client.get(f"/api/v1/executions/{eid}").get_json()
    assert detail["status"] == "succeeded"
    assert detail["steps"][0]["output"] == {"n": 5}
    assert detail["children"][0]["execution_id"] == child_id
    child = app_client.get(f"/api/v1/executions/{child_id}").get_json()
    assert child["parent"] == {"execution_id": eid, "step_id": "invoice"}
    app_client.environ_base.pop("HTTP_AUTHORIZATION")

    _sign_in(app_client, api_key)
    page = app_client.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="children"' in page and f"/ui/executions/{child_id}" in page
    page = app_client.get(f"/ui/executions/{child_id}").get_data(as_text=True)
    assert 'id="parent"' in page and f"/ui/executions/{eid}" in page

    shown = cli(env, "executions", "show", eid)
    assert shown.returncode == 0, shown.stderr
    assert f"step invoice started invoicing execution {child_id}" in shown.stdout
    shown = cli(env, "executions", "show", child_id)
    assert f"child of {eid} (step invoice), depth 1" in shown.stdout

    # Retention deletes the finished parent before its child: the link stays, and says so.
    db.execute(
        "UPDATE executions SET finished_at = now() - interval '1 hour' WHERE id = %s", (eid,)
    )
    with inprocess.pool(database_url, "test-console-children") as pool:
        Retention(pool, threading.Event()).expire()
    page = app_client.get(f"/ui/executions/{child_id}").get_data(as_text=True)
    assert 'id="parent"' in page and "parent deleted by retention" in page
    assert f"/ui/executions/{eid}" not in page
    shown = cli(env, "executions", "show", child_id)
    assert f"child of {eid} (parent deleted by retention) (step invoice)" in shown.stdout
