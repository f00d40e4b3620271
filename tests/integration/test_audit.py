"""Every operator action names its actor in the execution's history (docs/contract.md#actors): the
API key that asked, or `cli@host` for the CLI on the box. The API runs in-process over the
test's database; the CLI is the real `flowforge` command."""

from __future__ import annotations

import socket
from typing import Any

import psycopg

from flowforge.store.runs import load_run, save_run, unit_of_work
from tests.faults.helpers import cli
from tests.support.definitions import unsigned

# One POST nobody will send (no worker runs): the test loses its lease by hand.
CHARGE = unsigned(
    [
        {
            "id": "charge",
            "type": "http_request",
            "request": {"method": "POST", "url": "http://127.0.0.1:9/charge"},
        }
    ]
)


def lose_the_lease(db: psycopg.Connection, execution_id: str) -> None:
    """A worker claimed the POST and died mid-request: its outcome is unknown."""
    with unit_of_work(db):
        run = load_run(db, execution_id)
        assert run is not None
        run.claim("charge", "gone-worker")
        run.recover_lease("charge")
        save_run(db, run.take_changes())


def actors(client: Any, execution_id: str) -> list[tuple[str, dict[str, Any]]]:
    shown = client.get(f"/api/v1/executions/{execution_id}")
    assert shown.status_code == 200
    return [
        (e["kind"], e["detail"]["actor"])
        for e in shown.get_json()["events"]
        if "actor" in (e["detail"] or {})
    ]


def test_api_and_cli_actions_leave_their_actor_in_the_history(
    app_client: Any, api_key: str, db: psycopg.Connection, env: dict[str, str]
) -> None:
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    assert app_client.post("/api/v1/workflows/charge/versions", json=CHARGE).status_code == 201
    eid = app_client.post("/hooks/charge", json={}).get_json()["execution_id"]
    key_id, key_name = db.execute("SELECT id, name FROM api_keys").fetchone()  # type: ignore[misc]
    by_key = {"kind": "api_key", "id": key_id, "name": key_name}
    by_cli = {"kind": "cli", "name": f"cli@{socket.gethostname()}"}
    base = f"/api/v1/executions/{eid}"

    lose_the_lease(db, eid)
    resolved = app_client.post(f"{base}/steps/charge/resolve", json={"outcome": "failed"})
    assert resolved.status_code == 200, resolved.get_data(as_text=True)
    assert cli(env, "retry", eid).returncode == 0
    assert app_client.post(f"{base}/cancel").get_json()["status"] == "cancelled"
    assert app_client.post(f"{base}/retry").status_code == 202
    assert cli(env, "cancel", eid).returncode == 0
    assert cli(env, "retry", eid).returncode == 0
    lose_the_lease(db, eid)
    settled = cli(env, "resolve", eid, "charge", "succeeded", '{"id": 1}')
    assert settled.returncode == 0, settled.stderr

    assert actors(app_client, eid) == [
        ("step.resolved", by_key),
        ("execution.retried", by_cli),
        ("execution.cancel_requested", by_key),
        ("execution.retried", by_key),
        ("execution.cancel_requested", by_cli),
        ("execution.retried", by_cli),
        ("step.resolved", by_cli),
    ]
    # Cancelling what has already ended changes nothing, so it records nothing.
    assert app_client.post(f"{base}/cancel").status_code == 200
    assert len(actors(app_client, eid)) == 7
