"""What a webhook sender can and cannot choose, through a real bin/api (and a bin/worker
where an execution must run): a signed Stripe body without `id` or a Slack event without
`event_id` gets an identity derived from its signature, so a captured request resent
within the tolerance is the same execution (docs/reference/security.md); a priority that
is no priority is refused without echoing the sender's value; a sender's `traceparent`
keeps its trace id but the operator's sampler decides whether it is sampled; GitHub's
`ping` answers 200 and starts nothing; a replayed delivery answers its execution's status
now, not the "queued" of its first answer."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import requests

from tests.support.api import Api
from tests.support.processes import Process, start_api
from tests.support.webhooks import github_header, slack_header, stripe_header

STRIPE = "whsec_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6"
SLACK = "8f742231b10e8888abcd99yyyzzz85a5"
GITHUB = "It's a Secret to Everybody"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def definition(auth: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": f"{auth} intake",
        "trigger": {"webhook": {"auth": auth}},
        "steps": [{"id": "keep", "type": "transform", "output": {"got": "{{ input }}"}}],
        **extra,
    }


def signed(client: Api, key: str, auth: str, secret: str) -> None:
    client.publish(key, definition(auth))
    r = client.post(f"/api/v1/workflows/{key}/webhook-secrets", {"value": secret})
    assert r.status_code == 201, r.text


def executions(db: psycopg.Connection) -> int:
    return db.execute("SELECT count(*) FROM executions").fetchone()[0]


def post(base: str, key: str, body: bytes, headers: dict[str, str]) -> requests.Response:
    return requests.post(
        f"{base}/hooks/{key}",
        data=body,
        headers={"Content-Type": "application/json", **headers},
        timeout=10,
    )


def test_a_signed_event_without_an_id_is_identified_by_its_signature(
    client: Api, db: psycopg.Connection
) -> None:
    signed(client, "stripe", "stripe", STRIPE)
    signed(client, "slack", "slack", SLACK)
    now = int(time.time())
    stripe_body = json.dumps({"object": "event", "type": "charge.succeeded"}).encode()
    slack_body = json.dumps({"type": "app_rate_limited", "minute_rate_limited": 1}).encode()
    cases = {
        "stripe": (stripe_body, {"Stripe-Signature": stripe_header([STRIPE], now, stripe_body)}),
        "slack": (
            slack_body,
            {"X-Slack-Request-Timestamp": str(now),
             "X-Slack-Signature": slack_header(SLACK, now, slack_body)},
        ),
    }  # fmt: skip
    for key, (body, headers) in cases.items():
        answers = [post(client.base, key, body, headers) for _ in range(3)]
        assert [a.status_code for a in answers] == [202] * 3, [a.text for a in answers]
        assert len({a.json()["execution_id"] for a in answers}) == 1, key
        assert [a.headers.get("Idempotent-Replayed") for a in answers] == [None, "true", "true"]
    assert executions(db) == 2
    # Signed again a second later (a new signature), the same body is another delivery.
    later = now + 1
    again = post(
        client.base,
        "stripe",
        stripe_body,
        {"Stripe-Signature": stripe_header([STRIPE], later, stripe_body)},
    )
    assert again.status_code == 202 and again.headers.get("Idempotent-Replayed") is None


def test_a_priority_refusal_does_not_echo_the_senders_value(client: Api) -> None:
    client.publish("ranked", definition("none", priority="{{ input.priority }}"))
    for value in ("<script>alert(1)</script>", 10**30, -7.5):
        r = client.hook("ranked", {"priority": value})
        assert r.status_code == 422, r.text
        assert str(value) not in r.text and "script" not in r.text, r.text


def test_github_ping_answers_200_and_starts_nothing(client: Api, db: psycopg.Connection) -> None:
    signed(client, "gh", "github", GITHUB)
    body = json.dumps({"zen": "Design for failure.", "hook_id": 1}).encode()
    headers = {
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": "ping-1",
        "X-Hub-Signature-256": github_header(GITHUB, body),
    }
    r = post(client.base, "gh", body, headers)
    assert r.status_code == 200, r.text
    assert executions(db) == 0
    # Unsigned, a ping is refused like any other event.
    r = post(client.base, "gh", body, {**headers, "X-Hub-Signature-256": "sha256=" + "0" * 64})
    assert r.status_code == 401
    # Through a source too.
    client.post("/api/v1/sources/repo", {"auth": "github", "subscriptions": [{"workflow": "gh"}]})
    client.post("/api/v1/sources/repo/webhook-secrets", {"value": GITHUB})
    r = post(client.base, "repo", body, headers)
    assert r.status_code == 200, r.text
    assert executions(db) == 0
    assert db.execute("SELECT count(*) FROM source_unmatched").fetchone()[0] == 0
    # The captured ping relabelled as a push (GitHub signs no header) answers its routing:
    # none.
    relabelled = post(client.base, "repo", body, {**headers, "X-GitHub-Event": "push"})
    assert relabelled.status_code == 202 and relabelled.json()["executions"] == []
    assert executions(db) == 0


def test_a_replayed_delivery_answers_the_executions_status_now(
    client: Api, workers: Callable[..., Process]
) -> None:
    client.publish("plain", definition("none"))
    first = client.hook("plain", {"n": 1}, headers={"Idempotency-Key": "k-1"})
    assert first.json()["status"] == "queued"
    workers()
    client.wait(first.json()["execution_id"], timeout=30)
    again = client.hook("plain", {"n": 1}, headers={"Idempotency-Key": "k-1"})
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == {"execution_id": first.json()["execution_id"], "status": "succeeded"}


def test_a_senders_traceparent_keeps_its_trace_but_not_its_sampling_decision(
    env: dict[str, str], tmp_path: Path, api_key: str, db: psycopg.Connection
) -> None:
    """Exported nowhere (the console exporter writes to the API's log): what is checked is
    the trace context stored on each execution, which its spans will use."""
    for ratio, sent, expected in (("0", "01", "00"), ("1", "00", "01")):
        proc, base = start_api(
            {
                **env,
                "OTEL_TRACES_EXPORTER": "console",
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": ratio,
            },
            tmp_path / f"api-{ratio}.log",
        )
        try:
            client = Api(base, api_key)
            client.publish(f"traced-{ratio}", definition("none"))
            eid = client.start(
                f"traced-{ratio}",
                {},
                headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-{sent}"},
            )
        finally:
            proc.stop()
        (stored,) = db.execute(
            "SELECT traceparent FROM executions WHERE id = %s", (eid,)
        ).fetchone()
        assert stored.startswith(f"00-{TRACE}-") and stored.endswith(f"-{expected}"), stored
