"""Notification endpoints managed from the CLI on the box and the console, with no
processes: a real trigger records a failure, `notifications.coalesce` makes its message,
and the console shows it in the endpoint's history. Without an enabled endpoint the
triggers are off, so a failure writes nothing for notifications (docs/contract.md#notifications)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg_pool
import pytest

from flowforge.api import create_app
from flowforge.steps import netguard
from flowforge.store import notifications
from flowforge.store.config import Settings
from flowforge.trust.sealing import parse_key
from flowforge.worker.notifier import IDLE_S, PASS_S, Notifier
from tests.integration.test_api_keys import FLOWFORGE
from tests.integration.test_console import _sign_in
from tests.support.definitions import transform, unsigned
from tests.support.processes import TEST_NOTIFY_KEY, run_migrate

KEY = parse_key(TEST_NOTIFY_KEY)


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


class Counted(psycopg.Connection):  # type: ignore[type-arg]
    """A connection that counts the statements it sends (psycopg's, not ours)."""

    sent = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        Counted.sent += 1
        return super().execute(*args, **kwargs)


def test_the_notifier_asks_once_a_minute_while_no_endpoint_is_enabled(
    database_url: str, db: psycopg.Connection
) -> None:
    """No endpoint: one pass asks one question (the first also forgets old messages) and
    sleeps IDLE_S; a wake-up ends that sleep at once; creating an endpoint NOTIFYs the wake
    channel (the relay hears it for the notifier) and the next pass works every second."""
    pool = psycopg_pool.ConnectionPool(
        database_url, min_size=1, open=True, connection_class=Counted, kwargs={"autocommit": True}
    )
    stop = threading.Event()
    allow = netguard.Allowlist.parse("127.0.0.1")
    notifier = Notifier(pool, stop, allow=allow, window_s=1, disable_after_s=60, key=KEY)
    try:
        assert notifier.step() == IDLE_S >= 60
        Counted.sent = 0
        assert [notifier.step() for _ in range(3)] == [IDLE_S] * 3
        assert Counted.sent == 3  # notifications.ANY_ENABLED, once a pass
        asleep = threading.Thread(target=notifier.idle, args=(3600,))
        asleep.start()
        notifier.wake()
        asleep.join(timeout=30)
        assert not asleep.is_alive()

        with psycopg.connect(database_url, autocommit=True) as listener:
            listener.execute(notifications.LISTEN_WAKE)
            notifications.create(
                db, name="n", url="http://127.0.0.1:9/n", shape="standard",
                kinds=["queue.full"], workflow=None, key=KEY,
            )  # fmt: skip
            heard = list(listener.notifies(timeout=10, stop_after=1))
        assert [n.channel for n in heard] == [notifications.WAKE_CHANNEL]
        assert notifier.step() == PASS_S
    finally:
        stop.set()
        notifier.close()
        pool.close()


def _bounded_queue(
    open_client: Any, db: psycopg.Connection
) -> tuple[Callable[[int], list[int]], Callable[[], list[Any]]]:
    """Workflow `bounded` (one slot, max_queued 2) and a queue.full endpoint for it: a way
    to send n webhooks (their statuses) and to read the events recorded so far."""
    bounded = unsigned([transform("t", {})], concurrency={"limit": 1, "max_queued": 2})
    assert open_client.post("/api/v1/workflows/bounded/versions", json=bounded).status_code == 201
    notifications.create(
        db, name="q", url="http://127.0.0.1:9/q", shape="slack", kinds=["queue.full"],
        workflow="bounded", key=KEY,
    )  # fmt: skip

    def hooks(n: int) -> list[int]:
        return [open_client.post("/hooks/bounded", json={}).status_code for _ in range(n)]

    def recorded() -> list[Any]:
        return db.execute("SELECT kind, detail FROM notify_pending ORDER BY id").fetchall()

    return hooks, recorded


def test_queue_full_once_per_crossing_and_again_below_half(
    open_client: Any, db: psycopg.Connection
) -> None:
    """A queue of bound 2: the first refusal records queue.full, the next ones nothing;
    at 1 queued (half) it is not re-armed, at 0 it is, and the next crossing is news."""
    hooks, recorded = _bounded_queue(open_client, db)

    def drop_queued(n: int) -> None:
        db.execute(
            "UPDATE executions SET status = 'cancelled' WHERE id IN (SELECT id FROM executions"
            " WHERE status = 'queued' AND slot_at IS NULL LIMIT %s)",
            (n,),
        )

    assert hooks(5) == [202, 202, 202, 429, 429]  # one slot, two queued
    assert recorded() == [("queue.full", {"max_queued": 2})]
    drop_queued(1)
    assert notifications.rearm_queues(db) == 0  # 1 of 2 is not below half
    assert hooks(2) == [202, 429] and len(recorded()) == 1
    drop_queued(2)
    assert notifications.rearm_queues(db) == 1
    assert hooks(3) == [202, 202, 429] and len(recorded()) == 2


def test_queue_full_re_arms_when_a_new_version_changes_the_bound(
    open_client: Any, db: psycopg.Connection
) -> None:
    """The alarm remembers the bound it crossed. A new version with a larger max_queued
    makes the queue no longer full: its own crossing later is news, not swallowed by the
    old bound's alarm (which, at 2 queued of a bound of 2, is never below half)."""
    hooks, recorded = _bounded_queue(open_client, db)

    assert hooks(4) == [202, 202, 202, 429]
    assert recorded() == [("queue.full", {"max_queued": 2})]
    wider = unsigned([transform("t", {})], concurrency={"limit": 1, "max_queued": 4.0})
    assert open_client.post("/api/v1/workflows/bounded/versions", json=wider).status_code == 201
    notifications.rearm_queues(db)  # the notifier's pass
    assert hooks(3) == [202, 202, 429]
    assert recorded() == [("queue.full", {"max_queued": 2}), ("queue.full", {"max_queued": 4})]


def test_secrets_sealed_masked_rotated_and_old_rows_sealed(
    open_client: Any, db: psycopg.Connection, database_url: str, api_key: str
) -> None:
    """What the database holds is sealed: a standard endpoint's secret, a Slack one's URL
    (shown masked); rotation answers a new secret once; bin/migrate seals
    rows from before sql/0067, and without the key refuses and changes nothing."""
    body = {"name": "std", "url": "http://127.0.0.1:9/std", "kinds": ["execution.failed"]}
    made = open_client.post("/api/v1/notifications", json=body).get_json()
    hook = "https://hooks.slack.com/services/T0/B0/xyzzy"
    slack = {"name": "chat", "url": hook, "shape": "slack", "kinds": ["execution.failed"]}
    shown = open_client.post("/api/v1/notifications", json=slack).get_json()
    assert shown["url"] == "https://hooks.slack.com/…" and shown["secret"] is None
    rows = db.execute("SELECT name, url, secret, sealed FROM notify_endpoints ORDER BY name")
    stored = {name: (url, secret, bytes(sealed)) for name, url, secret, sealed in rows}
    assert stored["chat"][:2] == ("https://hooks.slack.com/…", None)
    assert stored["std"][:2] == ("http://127.0.0.1:9/std", None)
    assert (
        hook.encode() not in stored["chat"][2] and made["secret"].encode() not in stored["std"][2]
    )
    assert _opened(db, "std") == ("http://127.0.0.1:9/std", made["secret"])
    assert _opened(db, "chat") == (hook, None)
    listed = open_client.get("/api/v1/notifications").get_data(as_text=True)
    assert hook not in listed and made["secret"] not in listed

    rotated = open_client.post("/api/v1/notifications/std/rotate", json={}).get_json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != made["secret"]
    assert _opened(db, "std")[1] == rotated["secret"]
    moved = open_client.post("/api/v1/notifications/chat/rotate", json={"url": hook + "2"})
    assert moved.status_code == 200 and _opened(db, "chat") == (hook + "2", None)
    refused = open_client.post("/api/v1/notifications/std/rotate", json={"url": hook})
    assert refused.status_code == 409
    untyped = open_client.post("/api/v1/notifications/chat/rotate", json={"url": None})
    assert untyped.status_code == 422 and _opened(db, "chat") == (hook + "2", None)

    db.execute(
        "INSERT INTO notify_endpoints (name, url, shape, secret, kinds) VALUES"
        " ('old', 'http://127.0.0.1:9/old', 'standard', 'whsec_b2xk', '{execution.failed}'),"
        " ('oldchat', %s, 'slack', NULL, '{execution.failed}')",
        (hook,),
    )
    without = _migrate(database_url, "")
    assert without.returncode == 1 and "FLOWFORGE_NOTIFY_KEY" in without.stderr
    assert _opened(db, "old", None) == ("http://127.0.0.1:9/old", "whsec_b2xk")  # still sent
    done = _migrate(database_url, TEST_NOTIFY_KEY)
    assert done.returncode == 0 and "sealed 2 notification" in done.stdout, done.stderr
    assert _opened(db, "old") == ("http://127.0.0.1:9/old", "whsec_b2xk")
    assert _opened(db, "oldchat") == (hook, None)
    assert db.execute("SELECT count(*) FROM notify_endpoints WHERE sealed IS NULL").fetchone() == (
        0,
    )
    with pytest.raises(notifications.NotifyKeyMissing):
        notifications.create(
            db, name="nokey", url=hook, shape="slack", kinds=["queue.full"], workflow=None,
            key=None,
        )  # fmt: skip
    assert db.execute("SELECT count(*) FROM notify_endpoints WHERE name = 'nokey'").fetchone() == (
        0,
    )
    app = create_app(Settings(database_url=database_url, max_body_bytes=65_536))
    try:
        refused = app.test_client().post(
            "/api/v1/notifications",
            json={**body, "name": "nokey"},
            headers={"Authorization": f"Bearer {api_key}"},
        )
    finally:
        app.extensions["flowforge.pool"].close()
    assert refused.status_code == 503, refused.get_data(as_text=True)
    assert refused.get_json()["type"] == "urn:flowforge:problem:notify-key-missing"
    assert db.execute("SELECT count(*) FROM notify_endpoints WHERE name = 'nokey'").fetchone() == (
        0,
    )


def _opened(db: psycopg.Connection, name: str, key: bytes | None = KEY) -> tuple[str, str | None]:
    """Where the worker would send an endpoint's messages, and what it would sign with."""
    row = db.execute(
        "SELECT id, url, shape, secret, sealed FROM notify_endpoints WHERE name = %s", (name,)
    ).fetchone()
    assert row is not None
    endpoint_id, url, shape, secret, sealed = row
    message = notifications.Message("0", endpoint_id, {}, None, 1, url, shape, secret, sealed)  # type: ignore[arg-type]
    return message.opened(key)


def _migrate(database_url: str, notify_key: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")}
    env |= {"FLOWFORGE_DATABASE_URL": database_url, "FLOWFORGE_NOTIFY_KEY": notify_key}
    return run_migrate(env)
