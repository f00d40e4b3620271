"""Notification endpoints managed from the CLI on the box and the console, with no
processes: a real trigger records a failure, `notifications.coalesce` makes its message,
and the console shows it in the endpoint's history. Without an enabled endpoint the
triggers are off, so a failure writes nothing for notifications (docs/contract.md#notifications)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import psycopg

from flowforge.store import notifications
from flowforge.trust.sealing import parse_key
from tests.integration.test_api_keys import FLOWFORGE
from tests.integration.test_console import _sign_in
from tests.support.processes import TEST_NOTIFY_KEY


def cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script against the test database, with the notify key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")}
    env |= {"FLOWFORGE_DATABASE_URL": database_url, "FLOWFORGE_NOTIFY_KEY": TEST_NOTIFY_KEY}
    return subprocess.run(
        [str(FLOWFORGE), *args], env=env, capture_output=True, text=True, timeout=30
    )


def _fail_one(db: psycopg.Connection) -> str:
    (execution,) = db.execute(
        "UPDATE executions SET status = 'failed' WHERE id = (SELECT id FROM executions"
        " WHERE status <> 'failed' LIMIT 1) RETURNING id::text"
    ).fetchone()
    return str(execution)


def test_cli_console_and_the_trigger_switch(
    published: Any,
    api_key: str,
    database_url: str,
    db: psycopg.Connection,
) -> None:
    _fail_one(db)  # no endpoint: nothing recorded, and the triggers are off
    assert db.execute("SELECT count(*) FROM notify_pending").fetchone() == (0,)
    enabled = "SELECT DISTINCT tgenabled FROM pg_trigger WHERE tgname LIKE 'notify_%'"
    assert db.execute(enabled).fetchall() == [("D",)]

    made = cli(
        database_url, "notifications", "create", "oncall", "http://127.0.0.1:9/n",
        "--kind", "execution.failed", "--workflow", "open", "--output", "json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["secret"].startswith("whsec_")
    assert db.execute(enabled).fetchall() == [("O",)]

    failed = _fail_one(db)
    assert notifications.coalesce(db, window_s=0) == 1

    _sign_in(published, api_key)
    page = published.get("/ui/notifications").get_data(as_text=True)
    assert 'id="endpoint-oncall"' in page and "execution.failed" in page
    assert page.count('class="delivery delivery-pending"') == 1
    shown = cli(database_url, "notifications", "show", "oncall", "--output", "json")
    (delivery,) = json.loads(shown.stdout)["deliveries"]
    payload = db.execute("SELECT payload FROM notify_deliveries").fetchone()[0]
    assert delivery["events"] == 1 and payload["data"]["events"][0]["execution_id"] == failed

    token = _sign_in(published, api_key)
    r = published.post(
        "/ui/notifications/switch", data={"csrf": token, "name": "oncall", "to": "disable"}
    )
    assert r.status_code == 303
    assert db.execute(enabled).fetchall() == [("D",)]
    listed = cli(database_url, "notifications", "list", "--output", "json")
    assert json.loads(listed.stdout)["endpoints"][0]["disabled_reason"] == "operator"
    assert cli(database_url, "notifications", "enable", "oncall").returncode == 0
    assert db.execute(enabled).fetchall() == [("O",)]
    assert cli(database_url, "notifications", "delete", "oncall").returncode == 0
    assert db.execute(enabled).fetchall() == [("D",)]


def test_each_kind_is_recorded_by_its_trigger(
    published: Any,
    db: psycopg.Connection,
) -> None:
    """The state changes of each kind, as their writers make them, and one that is not news
    (an operator's pause)."""
    kinds = ["execution.failed", "execution.paused", "outcome.unknown", "circuit.opened"]
    notifications.create(
        db,
        name="all",
        url="http://127.0.0.1:9/n",
        shape="slack",
        kinds=kinds,
        workflow=None,
        key=parse_key(TEST_NOTIFY_KEY),
    )
    ids = [row[0] for row in db.execute("SELECT id FROM executions ORDER BY id").fetchall()]
    pause = "UPDATE executions SET status = 'paused', paused_from = 'running', pause_reason = %s"
    db.execute(pause + " WHERE id = %s", ("operator", ids[0]))
    db.execute(pause + " WHERE id = %s", ("exhausted", ids[1]))
    db.execute(
        "UPDATE steps SET status = 'unknown' WHERE (execution_id, step_id) ="
        " (SELECT execution_id, step_id FROM steps WHERE execution_id = %s LIMIT 1)",
        (ids[2],),
    )
    db.execute("UPDATE steps SET status = 'unknown' WHERE status = 'unknown'")  # no change
    db.execute("INSERT INTO outbound_limits (owner, key) VALUES ('host', 'api.example.com')")
    db.execute("UPDATE outbound_limits SET circuit = 'open'")
    db.execute("UPDATE executions SET status = 'failed' WHERE id = %s", (ids[2],))
    recorded = db.execute(
        "SELECT kind, execution_id, detail FROM notify_pending ORDER BY id"
    ).fetchall()
    assert [(kind, execution) for kind, execution, _ in recorded] == [
        ("execution.paused", ids[1]),
        ("outcome.unknown", ids[2]),
        ("circuit.opened", None),
        ("execution.failed", ids[2]),
    ]
    assert recorded[2][2] == {"owner": "host", "key": "api.example.com"}
    assert notifications.coalesce(db, window_s=0) == 1
    (payload,) = db.execute("SELECT payload FROM notify_deliveries").fetchone()
    assert payload["type"] == "notification.batch" and payload["data"]["count"] == 4
    assert notifications.forget(db) == 0  # pending, and new
    old = "UPDATE notify_deliveries SET status = 'delivered', created_at = now() - interval '31 d'"
    db.execute(old)
    assert notifications.forget(db) == 1
