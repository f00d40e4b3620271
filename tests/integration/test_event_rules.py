"""Events correlated by a business key (docs/contract.md#events), in-process: the rules of
who takes an event and when; real processes and the timeout race are
tests/integration/test_events.py's."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import psycopg
import pytest

from flowforge.cli.direct import Database
from flowforge.store import apikeys
from flowforge.worker.retention import Retention
from tests.support import inprocess
from tests.support.api import step
from tests.support.definitions import (
    github_event,
    github_source,
    subscription,
    transform,
    unsigned,
    wait,
)
from tests.support.inprocess import InProcess
from tests.support.webhooks import github_header


def order_flow(name: str = "orders", **fields: Any) -> dict[str, Any]:
    """Waits for payment.settled with the order's id, then says what it got."""
    return unsigned(
        [
            wait("paid", 3600, event="payment.settled", key="{{ input.order_id }}", **fields),
            transform("done", {"amount": "{{ paid.amount }}"}, after=("paid",)),
        ],
        name=name,
    )


def send(app: InProcess, body: dict[str, Any]) -> Any:
    return app.post("/api/v1/events", body)


def settled(app: InProcess, eid: str) -> dict[str, Any]:
    return app.until(
        lambda: (e := app.execution(eid))["status"] in {"succeeded", "failed"} and e,
        10,
        "the execution ends",
    )


def waiting(app: InProcess, eid: str, step_id: str = "paid") -> None:
    app.until(
        lambda: step(app.execution(eid), step_id)["status"] == "waiting", 10, "the wait opens"
    )


def test_an_event_after_the_wait_ends_it_with_its_payload(in_process: InProcess) -> None:
    in_process.publish("orders", order_flow())
    eid = in_process.start("orders", {"order_id": "o-1"})
    waiting(in_process, eid)
    r = send(in_process, {"name": "payment.settled", "key": "o-1", "payload": {"amount": 5}})
    assert r.status_code == 202, r.text
    assert r.json()["delivered"] == 1
    done = settled(in_process, eid)
    assert done["status"] == "succeeded"
    assert step(done, "paid")["output"] == {"amount": 5}
    assert step(done, "done")["output"] == {"amount": 5}
    # Another order's event is not this wait's.
    listed = in_process.app.get("/api/v1/events?name=payment.settled&key=o-1").get_json()
    assert [e["consumed_by"] for e in listed["events"]] == [1]


def test_an_event_before_the_wait_is_kept_and_taken_once(in_process: InProcess) -> None:
    in_process.publish("orders", order_flow())
    body = {"name": "payment.settled", "key": "o-2", "payload": {"amount": 7}, "id": "ev-1"}
    first = send(in_process, body)
    assert first.status_code == 202 and first.json()["delivered"] == 0
    # A redelivery is the same event: 200, the same id, nothing new.
    again = send(in_process, body)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    # The same identity with another payload is a conflict.
    assert send(in_process, {**body, "payload": {"amount": 8}}).status_code == 409
    eid = in_process.start("orders", {"order_id": "o-2"})
    done = settled(in_process, eid)
    assert step(done, "paid")["output"] == {"amount": 7}
    # Both executions waiting for the same order take it (each step at most once).
    second = in_process.start("orders", {"order_id": "o-2"})
    assert step(settled(in_process, second), "paid")["output"] == {"amount": 7}


def test_lookback_zero_takes_only_later_events(in_process: InProcess) -> None:
    in_process.publish("orders", order_flow(lookback_s=0))
    send(in_process, {"name": "payment.settled", "key": "o-3", "payload": {"amount": 1}})
    eid = in_process.start("orders", {"order_id": "o-3"})
    waiting(in_process, eid)
    send(in_process, {"name": "payment.settled", "key": "o-3", "payload": {"amount": 2}})
    assert step(settled(in_process, eid), "paid")["output"] == {"amount": 2}


def test_every_current_waiter_takes_the_event(in_process: InProcess) -> None:
    in_process.publish("orders", order_flow())
    in_process.publish("audits", order_flow("audits"))
    eids = [
        in_process.start("orders", {"order_id": "o-4"}),
        in_process.start("audits", {"order_id": "o-4"}),
    ]
    for eid in eids:
        waiting(in_process, eid)
    r = send(in_process, {"name": "payment.settled", "key": "o-4", "payload": {"amount": 3}})
    assert r.json()["delivered"] == 2
    for eid in eids:
        assert step(settled(in_process, eid), "paid")["output"] == {"amount": 3}


def test_a_scoped_key_reaches_only_its_own_workflows(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    in_process.publish("orders", order_flow())
    in_process.publish("audits", order_flow("audits"))
    mine = in_process.start("orders", {"order_id": "o-5"})
    theirs = in_process.start("audits", {"order_id": "o-5"})
    waiting(in_process, mine)
    waiting(in_process, theirs)
    scoped = apikeys.create(db, "orders team", workflows=["orders"])[1]
    r = in_process.app.post(
        "/api/v1/events",
        json={"name": "payment.settled", "key": "o-5", "payload": {"amount": 9}},
        headers={"Authorization": f"Bearer {scoped}"},
    )
    assert r.status_code == 202 and r.get_json()["delivered"] == 1
    assert step(settled(in_process, mine), "paid")["output"] == {"amount": 9}
    assert step(in_process.execution(theirs), "paid")["status"] == "waiting"
    # The scoped key lists only what its workflows may take; a read-only key sends nothing.
    reader = apikeys.create(db, "auditor", read_only=True)[1]
    refused = in_process.app.post(
        "/api/v1/events",
        json={"name": "payment.settled", "key": "o-5", "payload": {}},
        headers={"Authorization": f"Bearer {reader}"},
    )
    assert refused.status_code == 403
    other = apikeys.create(db, "audits team", workflows=["audits"])[1]
    seen = in_process.app.get("/api/v1/events", headers={"Authorization": f"Bearer {other}"})
    assert seen.get_json() == {"events": []}


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"name": "Payment Settled", "key": "k", "payload": 1}, "$.name"),
        ({"name": "p", "key": "", "payload": 1}, "$.key"),
        ({"name": "p", "key": "k"}, "$.payload"),
        ({"name": "p", "key": "k", "payload": 1, "extra": 1}, "$.extra"),
    ],
)
def test_bad_events_are_refused_with_their_paths(
    in_process: InProcess, body: dict[str, Any], path: str
) -> None:
    r = send(in_process, body)
    assert r.status_code == 422, r.text
    assert path in [e["path"] for e in r.json()["errors"]]


def test_a_payload_over_the_body_limit_is_413(in_process: InProcess) -> None:
    big = {"name": "p", "key": "k", "payload": "x" * 70_000}
    assert send(in_process, big).status_code == 413
    assert in_process.app.get("/api/v1/events?name=p").get_json() == {"events": []}


def test_a_verified_source_delivery_emits_its_workflows_event(in_process: InProcess) -> None:
    secret = "routing-secret-for-github-1234"
    pushes = {
        "name": "pushes",
        "trigger": {"webhook": {"auth": "github"}},
        "emits": {"event": "repo.pushed", "key": "{{ input.ref }}"},
        "steps": [{"id": "keep", "type": "transform", "output": 1}],
    }
    in_process.publish("pushes", pushes)
    source = github_source(subscription("pushes", github_event("push")))
    assert in_process.post("/api/v1/sources/gh", source).status_code == 200
    made = in_process.post("/api/v1/sources/gh/webhook-secrets", {"value": secret})
    assert made.status_code == 201
    waiter = unsigned(
        [wait("pushed", 3600, event="repo.pushed", key="{{ input.ref }}", **{"from": "pushes"})],
        name="deploys",
    )
    in_process.publish("deploys", waiter)
    eid = in_process.start("deploys", {"ref": "refs/heads/main"})
    waiting(in_process, eid, "pushed")
    raw = json.dumps({"ref": "refs/heads/main"}).encode()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": github_header(secret, raw),
    }
    routed = in_process.app.post("/hooks/gh", data=raw, headers=headers)
    assert routed.status_code == 202, routed.get_data(as_text=True)
    done = settled(in_process, eid)
    assert step(done, "pushed")["output"] == {"ref": "refs/heads/main"}


def test_the_cli_on_the_box_sends_and_lists_as_the_api_does(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    in_process.publish("orders", order_flow())
    eid = in_process.start("orders", {"order_id": "o-9"})
    waiting(in_process, eid)
    box = Database(db)
    body = {"name": "payment.settled", "key": "o-9", "payload": {"amount": 4}, "id": "box-1"}
    assert box.send_event(dict(body))["delivered"] == 1
    assert box.send_event(dict(body))["replayed"] is True
    assert [e["delivery_id"] for e in box.events("payment.settled", "o-9", 10)] == ["box-1"]
    assert step(settled(in_process, eid), "paid")["output"] == {"amount": 4}


def test_an_expired_event_is_deleted_with_its_consumptions(
    in_process: InProcess, db: psycopg.Connection, database_url: str
) -> None:
    in_process.publish("orders", order_flow())
    send(in_process, {"name": "payment.settled", "key": "o-7", "payload": 1, "id": "old"})
    send(in_process, {"name": "payment.settled", "key": "o-7", "payload": 2, "id": "new"})
    assert (
        step(settled(in_process, in_process.start("orders", {"order_id": "o-7"})), "paid")["output"]
        == 1
    )
    db.execute("UPDATE events SET expires_at = now() - interval '1 s' WHERE delivery_id = 'old'")
    with inprocess.pool(database_url, "test-events", max_size=2) as pool:
        assert Retention(pool, threading.Event()).expire_events() == (1, True)
    listed = in_process.app.get("/api/v1/events?key=o-7").get_json()["events"]
    assert [e["delivery_id"] for e in listed] == ["new"]
    assert db.execute("SELECT count(*) FROM event_consumptions").fetchone() == (0,)
