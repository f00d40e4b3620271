"""Operational notifications (docs/contract.md#notifications) with a real bin/api, a real
bin/worker and a receiver on 127.0.0.1: every message verifies with the `standardwebhooks`
library, a 410 disables the endpoint until an operator enables it again, a burst of a
thousand failures is a bounded number of messages, a receiver that holds its answer
for 30 s delays no execution nor another endpoint's messages, and a real worker's pause on
exhausted retries and opened circuit are told."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import requests
from standardwebhooks import Webhook

from flowforge.store import apikeys
from tests.support.api import Api
from tests.support.definitions import http, transform, unsigned, wait
from tests.support.processes import Process, wait_for
from tests.support.target import Received, Reply, Target

WINDOW_S = 1.0


@pytest.fixture
def notifying(workers: Callable[..., Process], client: Api, target: Target) -> tuple[Api, Target]:
    """A worker with a one-second coalescing window, and workflow `failing` whose step gets
    a 500 from /fail (one attempt), so each execution fails."""
    workers(FLOWFORGE_NOTIFY_WINDOW_S=str(WINDOW_S))
    failing = http("call", "GET", f"{target.url}/fail", retry={"max_attempts": 1})
    client.publish("failing", unsigned([failing]))
    client.publish("passing", unsigned([transform("done", {"ok": True})]))
    _script(target, lambda r: Reply(200))
    return client, target


def _subscribe(client: Api, target: Target, name: str = "oncall", **extra: Any) -> dict[str, Any]:
    body = {"name": name, "url": f"{target.url}/notify", "kinds": ["execution.failed"], **extra}
    r = client.post("/api/v1/notifications", body)
    assert r.status_code == 201, r.text
    return r.json()


def _notes(target: Target) -> list[Received]:
    return [r for r in list(target.received) if r.path == "/notify"]


def _script(target: Target, notify: Callable[[Received], Reply]) -> None:
    target.script = lambda r: notify(r) if r.path == "/notify" else Reply(500, json={"no": 1})


def _executions(message: Received) -> list[str]:
    return [event["execution_id"] for event in message.json()["data"]["events"]]


def test_messages_verify_retry_after_and_bad_input(
    notifying: tuple[Api, Target], db: psycopg.Connection
) -> None:
    """Bad input answers 422 with nothing saved; every message verifies with the
    `standardwebhooks` library; a Retry-After is honoured and keeps the message's id."""
    client, target = notifying
    bad = client.post("/api/v1/notifications", {"name": "x", "url": "ftp://a", "kinds": []})
    assert bad.status_code == 422 and bad.headers["Content-Type"] == "application/problem+json"
    unknown = {"name": "x", "url": f"{target.url}/n", "kinds": ["execution.exploded"]}
    assert client.post("/api/v1/notifications", unknown).status_code == 422
    untyped = {"name": "x", "url": f"{target.url}/n", "kinds": ["execution.failed"]}
    assert client.post("/api/v1/notifications", {**untyped, "workflow": None}).status_code == 422
    assert db.execute("SELECT count(*) FROM notify_endpoints").fetchone() == (0,)
    scoped = apikeys.create(db, "scoped", workflows=["failing"])[1]
    r = requests.get(
        f"{client.base}/api/v1/notifications",
        headers={"Authorization": f"Bearer {scoped}"},
        timeout=10,
    )
    assert r.status_code == 403

    secret = _subscribe(client, target)["secret"]
    again = {"name": "oncall", "url": f"{target.url}/n", "kinds": ["execution.failed"]}
    assert client.post("/api/v1/notifications", again).status_code == 409
    failed = client.start("failing", {})
    client.start("passing", {})  # succeeds: not news
    client.wait(failed, "failed")
    wait_for(lambda: _notes(target), timeout=20, message="a notification")
    (message,) = _notes(target)
    verified = Webhook(secret).verify(message.body, message.headers)
    assert verified["type"] == "execution.failed"
    assert verified["data"]["count"] == 1
    assert _executions(message) == [failed]
    assert message.headers["webhook-id"].startswith("msg_")
    wait_for(
        lambda: _endpoint(client)["deliveries"][0]["status"] == "delivered",
        timeout=10,
        message="the delivery recorded",
    )
    assert _endpoint(client)["deliveries"][0]["id"] == message.headers["webhook-id"]

    answers = iter([Reply(503, headers={"Retry-After": "1"})])
    _script(target, lambda r: next(answers, Reply(200)))
    client.wait(client.start("failing", {}), "failed")
    wait_for(lambda: len(_notes(target)) >= 3, timeout=20, message="the retried notification")
    first, second = _notes(target)[1:3]
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert second.at - first.at >= 0.9  # not before the Retry-After said
    for each in (first, second):
        Webhook(secret).verify(each.body, each.headers)


def test_gone_disables_until_enabled_and_a_slow_receiver_delays_nothing(
    notifying: tuple[Api, Target], db: psycopg.Connection
) -> None:
    """A 410 disables the endpoint (and, no endpoint being enabled, the triggers); what
    fails meanwhile is never sent; enabled again, it is told of what fails next. Then the
    receiver holds its answer for 30 s: executions started meanwhile end as they would
    without it, while that request is still open."""
    client, target = notifying
    _script(target, lambda r: Reply(410))
    _subscribe(client, target)
    client.wait(client.start("failing", {}), "failed")
    endpoint = wait_for(
        lambda: None if (e := _endpoint(client))["enabled"] else e,
        timeout=20,
        message="the endpoint disabled by its 410",
    )
    assert endpoint["disabled_reason"] == "gone"
    assert _triggers(db) == {"D"}  # no endpoint enabled: the failure path runs no trigger

    released = threading.Event()
    _script(target, lambda r: (released.wait(30), Reply(200))[1])
    while_disabled = client.start("failing", {})
    client.wait(while_disabled, "failed")
    time.sleep(3 * WINDOW_S + 1)  # passes of the notifier that must send nothing
    assert len(_notes(target)) == 1

    r = client.post("/api/v1/notifications/oncall/enable")
    assert r.status_code == 200 and r.json()["enabled"], r.text
    assert _triggers(db) == {"O"}
    try:
        after = client.start("failing", {})
        client.wait(after, "failed")
        wait_for(lambda: len(_notes(target)) == 2, timeout=20, message="notified again")
        assert _executions(_notes(target)[1]) == [after]  # nothing of the disabled time
        before = time.monotonic()
        later = [client.start("failing", {}) for _ in range(3)]
        for execution in later:
            client.wait(execution, "failed", timeout=20)
        took = time.monotonic() - before
        assert not released.is_set() and len(_notes(target)) == 2  # still held, meanwhile
        print(f"3 executions failed in {took:.2f} s while the receiver held its answer")
    finally:
        released.set()


def test_a_burst_of_a_thousand_failures_is_a_few_messages(
    notifying: tuple[Api, Target], db: psycopg.Connection
) -> None:
    """The failures are a thousand executions' status changes through the real trigger,
    made in SQL: the worker would take minutes to fail a thousand executions here. Then,
    with the same processes, a slow receiver and the pause and circuit kinds (below)."""
    client, target = notifying
    _subscribe(client, target)
    client.publish("held", unsigned([wait("approve", 3600)]))
    first = client.start("held", {})
    client.wait(first, "waiting")
    db.execute(
        "INSERT INTO executions (id, workflow_id, version_id, status, input)"
        " SELECT gen_random_uuid(), workflow_id, version_id, 'waiting', input"
        " FROM executions, generate_series(1, 999) WHERE id = %s",
        (first,),
    )
    started = time.monotonic()
    for _ in range(10):
        db.execute(
            "UPDATE executions SET status = 'failed' WHERE id IN (SELECT id FROM executions"
            " WHERE status = 'waiting' LIMIT 100)"
        )
        time.sleep(0.5)
    spread = time.monotonic() - started

    def counted() -> int:
        return sum(note.json()["data"]["count"] for note in _notes(target))

    wait_for(lambda: counted() == 1000, timeout=30, message="every failure counted")
    messages = _notes(target)
    bound = spread / WINDOW_S + 2
    print(f"1000 failures over {spread:.1f} s: {len(messages)} messages (bound {bound:.0f})")
    assert len(messages) <= bound
    assert all(len(m.json()["data"]["events"]) <= 20 for m in messages)
    assert len({m.headers["webhook-id"] for m in messages}) == len(messages)
    # The same processes serve the next part (their start and stop are most of a test).
    _a_slow_receiver_holds_only_its_own_and_pause_and_circuit_are_told(client, target, db)


def _endpoint(client: Api) -> dict[str, Any]:
    r = client.session.get(f"{client.base}/api/v1/notifications/oncall", timeout=10)
    assert r.status_code == 200, r.text
    return json.loads(r.text)


def _triggers(db: psycopg.Connection) -> set[str]:
    rows = db.execute("SELECT tgenabled FROM pg_trigger WHERE tgname LIKE 'notify_%'").fetchall()
    return {row[0] for row in rows}


def _a_slow_receiver_holds_only_its_own_and_pause_and_circuit_are_told(
    client: Api, target: Target, db: psycopg.Connection
) -> None:
    """Endpoint `slow` holds its answer; endpoint `fast`, subscribed after `slow`'s message
    is already held, gets its own while that attempt is still open (nothing recorded of it
    yet: one after the other, it would have been sent only once `slow`'s attempt had timed
    out and been recorded). Then a step whose tries run out with on_exhausted pause, through
    a circuit that opens at its first failure: `fast` is told both."""
    released = threading.Event()

    def script(r: Received) -> Reply:
        if r.path == "/notify/slow":
            released.wait(30)
            return Reply(200)
        return Reply(200) if r.path.startswith("/notify") else Reply(500, json={"no": 1})

    target.script = script
    _subscribe(client, target, "slow", url=f"{target.url}/notify/slow")
    try:
        client.wait(client.start("failing", {}), "failed")
        wait_for(lambda: _at(target, "/notify/slow"), timeout=20, message="slow's message held")
        kinds = ["execution.failed", "execution.paused", "circuit.opened"]
        _subscribe(client, target, "fast", url=f"{target.url}/notify/fast", kinds=kinds)
        failed = client.start("failing", {})
        client.wait(failed, "failed")
        wait_for(lambda: _at(target, "/notify/fast"), timeout=20, message="fast's message")
        held = db.execute(
            "SELECT d.status, d.last_error FROM notify_deliveries d"
            " JOIN notify_endpoints e ON e.id = d.endpoint_id WHERE e.name = 'slow'"
        ).fetchall()
        assert not released.is_set() and held[0] == ("pending", None), held
        assert _executions(_at(target, "/notify/fast")[0]) == [failed]

        pausing = http("call", "GET", f"{target.url}/down")
        pausing |= {"limit": "down", "retry": {"max_attempts": 1, "on_exhausted": "pause"}}
        circuit = {"circuit": {"failures": 1, "window_s": 60, "cool_down_s": 600}}
        client.publish("down", {**unsigned([pausing]), "limits": {"down": circuit}})
        paused = client.start("down", {})
        told: Counter[str] = Counter()

        def both() -> bool:
            told.clear()
            for note in _at(target, "/notify/fast")[1:]:
                told.update(note.json()["data"]["kinds"])
            return told["execution.paused"] == 1 and told["circuit.opened"] == 1

        wait_for(both, timeout=30, message=f"pause and circuit told ({told})")
        assert client.execution(paused)["status"] == "paused"
    finally:
        released.set()


def _at(target: Target, path: str) -> list[Received]:
    return [r for r in list(target.received) if r.path == path]
