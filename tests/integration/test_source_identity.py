"""A source's delivery identity (docs/reference/security.md, identity spaces): against a
real bin/api, a delivery's identity is the source's own, per source and delivery, in a
space no client key reaches. A sender who posts `Idempotency-Key: source:<name>:<id>` to a
subscribed workflow cannot block the real delivery, and a captured signed delivery resent
with other (unsigned) headers answers its original routing and starts nothing new."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import requests

from tests.support import definitions
from tests.support.api import Api
from tests.support.definitions import github_event, github_source, subscription, transform
from tests.support.processes import Process, wait_for
from tests.support.webhooks import github_header

SECRET = "identity-secret-for-github-1234"


def workflow(name: str) -> dict[str, Any]:
    return definitions.workflow(transform("keep", {"n": "{{ input.n }}"}), name=name)


SOURCE = github_source(
    subscription("on-push", github_event("push")),
    subscription("on-release", github_event("release")),
)


def setup(client: Api) -> None:
    for name in ("on-push", "on-release"):
        client.publish(name, workflow(name))
    assert client.post("/api/v1/sources/gh", SOURCE).status_code == 200
    assert client.post("/api/v1/sources/gh/webhook-secrets", {"value": SECRET}).status_code == 201


def deliver(base: str, event: str, raw: bytes, delivery: str) -> requests.Response:
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": github_header(SECRET, raw),
    }
    return requests.post(f"{base}/hooks/gh", data=raw, headers=headers, timeout=30)


def executions(db: psycopg.Connection) -> list[tuple[str, str]]:
    rows = db.execute(
        "SELECT w.key, e.id::text FROM executions e JOIN workflows w ON w.id = e.workflow_id "
        "ORDER BY e.id"
    ).fetchall()
    return [(key, execution_id) for key, execution_id in rows]


def test_a_client_key_spelled_like_a_source_delivery_cannot_block_it(
    client: Api, db: psycopg.Connection
) -> None:
    setup(client)
    raw = json.dumps({"n": 1}).encode()
    # The attacker claims the key the source used to make for delivery msg_a, through both
    # headers an unsigned workflow takes its identity from: with another body on the
    # workflow the delivery routes to, and with the very body on the other subscriber.
    planted = [
        client.start("on-push", {"n": 666}, headers={"Idempotency-Key": "source:gh:msg_a"}),
        client.start("on-release", {"n": 1}, headers={"webhook-id": "source:gh:msg_a"}),
    ]
    for _ in range(3):
        r = deliver(client.base, "push", raw, "msg_a")
        assert r.status_code == 202, r.text
        [routed] = r.json()["executions"]
        assert routed["workflow"] == "on-push"
        assert routed["execution_id"] not in planted
    row = db.execute(
        "SELECT origin FROM idempotency_keys WHERE execution_id = %s", (routed["execution_id"],)
    ).fetchone()
    assert row == ("system",)
    # The sender's own key still answers the sender's own execution.
    again = client.hook("on-push", {"n": 666}, headers={"Idempotency-Key": "source:gh:msg_a"})
    assert again.json()["execution_id"] == planted[0]


def test_a_captured_delivery_resent_with_other_headers_answers_its_original_routing(
    client: Api, db: psycopg.Connection
) -> None:
    setup(client)
    raw = json.dumps({"n": 2}).encode()
    first = deliver(client.base, "push", raw, "d-1")
    assert first.status_code == 202, first.text
    [original] = first.json()["executions"]
    assert original["workflow"] == "on-push"
    before = executions(db)
    # GitHub signs the body only: the same signature holds whatever X-GitHub-Event says.
    for event in ("release", "push", "ping-me"):
        again = deliver(client.base, event, raw, "d-1")
        assert again.status_code == 202, again.text
        assert again.headers.get("Idempotent-Replayed") == "true"
        assert [(e["workflow"], e["execution_id"]) for e in again.json()["executions"]] == [
            ("on-push", original["execution_id"])
        ]
    assert executions(db) == before
    # A delivery that matched nothing stays unmatched whatever headers come with it later.
    unmatched = deliver(client.base, "issues", raw, "d-2")
    assert unmatched.status_code == 202 and unmatched.json()["executions"] == []
    assert deliver(client.base, "release", raw, "d-2").json()["executions"] == []
    assert executions(db) == before
    # Even where the new header would choose a subscriber whose input_schema refuses the
    # body, the redelivery answers its first routing.
    strict = {**workflow("on-release"), "input_schema": {"required": ["never-sent"]}}
    client.publish("on-release", strict)
    again = deliver(client.base, "release", raw, "d-1")
    assert again.status_code == 202, again.text
    assert again.json()["executions"][0]["execution_id"] == original["execution_id"]
    # Another body under a known delivery id is a conflict, not a new routing.
    other = deliver(client.base, "release", json.dumps({"n": 3}).encode(), "d-1")
    assert other.status_code == 409, other.text
    assert executions(db) == before


def test_a_deliverys_identity_is_forgotten_with_the_idempotency_keys(
    client: Api, db: psycopg.Connection, workers: Callable[..., Process]
) -> None:
    setup(client)
    raw = json.dumps({"n": 4}).encode()
    first = deliver(client.base, "push", raw, "old").json()["executions"]
    deliver(client.base, "push", raw, "young")
    for table in ("source_deliveries", "idempotency_keys"):
        db.execute(f"UPDATE {table} SET created_at = now() - interval '90 minutes'")
    db.execute("UPDATE source_deliveries SET created_at = now() WHERE identity = 'young'")
    workers(FLOWFORGE_IDEMPOTENCY_KEY_HOURS="1")
    wait_for(
        lambda: db.execute("SELECT identity FROM source_deliveries").fetchall() == [("young",)],
        timeout=30,
        message="housekeeping to forget the old delivery",
    )
    # Forgotten, the same delivery is a new one (as for any key past its lifetime).
    again = deliver(client.base, "push", raw, "old").json()["executions"]
    assert again[0]["execution_id"] != first[0]["execution_id"]
