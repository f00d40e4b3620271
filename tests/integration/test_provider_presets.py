"""Provider signature presets (docs/contract.md#presets), in the test's process (the API app,
`in_process`) but for the per-process cache of targets, which a real bin/api shows: Stripe, GitHub,
Shopify and Slack webhooks start a workflow only when signed as the provider documents, every
tampering is a 401 that writes nothing, and the provider's delivery id is the identity.

Signatures are made by tests/support/webhooks.py from each provider's documentation
(standard library only), and each request's fate is cross-checked with the provider's
own verifier — Stripe's `stripe.WebhookSignature`, Slack's `slack_sdk` SignatureVerifier,
GitHub's and Shopify's published Python snippets — and with GitHub's published vector;
never with flowforge.trust.presets checking itself.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
import stripe
from slack_sdk.signature import SignatureVerifier

from tests.support.api import Api
from tests.support.definitions import transform, workflow
from tests.support.inprocess import InProcess
from tests.support.processes import start_api
from tests.support.webhooks import (
    github_header,
    github_reference,
    shopify_header,
    shopify_reference,
    slack_header,
    stripe_header,
)

SECRETS = {
    # Shaped like each provider's: Stripe whsec_…, GitHub chosen by the user, Shopify's
    # app client secret, Slack's 32-hex signing secret.
    "stripe": "whsec_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6",
    "github": "It's a Secret to Everybody",
    "shopify": "shpss_" + "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "slack": "8f742231b10e8888abcd99yyyzzz85a5",
}
OTHER_SECRET = "a-secret-nobody-gave-to-flowforge"
TOLERANCE = 300


def definition(auth: str) -> dict[str, Any]:
    return workflow(transform("keep", {"got": "{{ input }}"}), auth=auth, name=f"{auth} intake")


@dataclass
class Delivery:
    body: bytes
    headers: dict[str, str]
    identity: str


def stripe_delivery(
    secrets: list[str], body: bytes | None = None, ts: int | None = None
) -> Delivery:
    event = {"object": "event", "type": "charge.succeeded", "data": {"amount": 42}}
    body = body or json.dumps({"id": f"evt_{uuid.uuid4().hex[:24]}", **event}).encode()
    ts = int(time.time()) if ts is None else ts
    headers = {"Stripe-Signature": stripe_header(secrets, ts, body)}
    return Delivery(body, headers, json.loads(body)["id"])


def identified(
    body: bytes, signature: tuple[str, str], id_header: str, topic: tuple[str, str]
) -> Delivery:
    """A delivery whose signature header and value are given, with a new delivery id in
    `id_header` (GitHub's and Shopify's way) and its topic header."""
    delivery = str(uuid.uuid4())
    return Delivery(
        body, {signature[0]: signature[1], id_header: delivery, topic[0]: topic[1]}, delivery
    )


def github_delivery(
    secrets: list[str], body: bytes | None = None, ts: int | None = None
) -> Delivery:
    body = body or json.dumps({"action": "opened", "number": uuid.uuid4().int % 1000}).encode()
    signature = ("X-Hub-Signature-256", github_header(secrets[0], body))
    return identified(body, signature, "X-GitHub-Delivery", ("X-GitHub-Event", "pull_request"))


def shopify_delivery(
    secrets: list[str], body: bytes | None = None, ts: int | None = None
) -> Delivery:
    body = body or json.dumps({"id": uuid.uuid4().int % 10**9, "email": "a@b.c"}).encode()
    signature = ("X-Shopify-Hmac-Sha256", shopify_header(secrets[0], body))
    return identified(body, signature, "X-Shopify-Webhook-Id", ("X-Shopify-Topic", "orders/create"))


def slack_delivery(
    secrets: list[str], body: bytes | None = None, ts: int | None = None
) -> Delivery:
    event = {"type": "event_callback", "event": {"type": "app_mention"}}
    body = body or json.dumps({"event_id": f"Ev{uuid.uuid4().hex[:10].upper()}", **event}).encode()
    ts = int(time.time()) if ts is None else ts
    headers = {
        "X-Slack-Request-Timestamp": str(ts),
        "X-Slack-Signature": slack_header(secrets[0], ts, body),
    }
    return Delivery(body, headers, json.loads(body).get("event_id", ""))


def stripe_accepts(secret: str, d: Delivery) -> bool:
    try:
        stripe.WebhookSignature.verify_header(
            d.body.decode(), d.headers.get("Stripe-Signature", ""), secret, TOLERANCE
        )
    except stripe.SignatureVerificationError:
        return False
    return True


def slack_accepts(secret: str, d: Delivery) -> bool:
    return SignatureVerifier(secret).is_valid_request(d.body, d.headers)


def github_accepts(secret: str, d: Delivery) -> bool:
    return github_reference(secret, d.body, d.headers.get("X-Hub-Signature-256"))


def shopify_accepts(secret: str, d: Delivery) -> bool:
    header = d.headers.get("X-Shopify-Hmac-Sha256")
    return header is not None and shopify_reference(secret, d.body, header)


@dataclass
class Provider:
    deliver: Callable[..., Delivery]
    reference: Callable[[str, Delivery], bool]
    required: tuple[str, ...]  # headers without which FlowForge refuses
    timestamp: str | None  # the header carrying the signed timestamp, if the scheme has one


PROVIDERS = {
    "stripe": Provider(stripe_delivery, stripe_accepts, ("Stripe-Signature",), None),
    "github": Provider(
        github_delivery, github_accepts, ("X-Hub-Signature-256", "X-GitHub-Delivery"), None
    ),
    "shopify": Provider(
        shopify_delivery, shopify_accepts, ("X-Shopify-Hmac-Sha256", "X-Shopify-Webhook-Id"), None
    ),
    "slack": Provider(
        slack_delivery,
        slack_accepts,
        ("X-Slack-Signature", "X-Slack-Request-Timestamp"),
        "X-Slack-Request-Timestamp",
    ),
}


def counts(db: psycopg.Connection) -> dict[str, int]:
    return {
        table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        for table in ("executions", "steps", "outbox", "idempotency_keys", "execution_events")
    }


def post(client: Api | InProcess, key: str, d: Delivery, **extra: str) -> Any:
    """The delivery's exact bytes and headers to the workflow's webhook."""
    return client.hook(key, None, headers={**d.headers, **extra}, raw=d.body)


def add_secret(client: Api | InProcess, key: str, value: str) -> int:
    r = client.post(f"/api/v1/workflows/{key}/webhook-secrets", {"value": value})
    assert r.status_code == 201, r.text
    assert value not in r.text  # sealed, and not echoed back
    return r.json()["id"]


def tamperings(name: str, secret: str) -> dict[str, Delivery]:
    """Every way the brief names of getting a webhook wrong, for one provider."""
    provider = PROVIDERS[name]
    now = int(time.time())
    good = provider.deliver([secret])
    out = {
        "body-changed": Delivery(good.body.replace(b"}", b', "x": 1}', 1), good.headers, ""),
        "body-whitespace": Delivery(good.body + b" ", good.headers, ""),
        "other-secret": provider.deliver([OTHER_SECRET], good.body),
    }
    for header in provider.required:
        out[f"missing-{header}"] = Delivery(
            good.body, {k: v for k, v in good.headers.items() if k != header}, ""
        )
    if name in ("stripe", "slack"):
        out["stale"] = provider.deliver([secret], good.body, now - TOLERANCE - 5)
        out["future"] = provider.deliver([secret], good.body, now + TOLERANCE + 5)
        if name == "stripe":
            changed = re.sub(
                r"t=(\d+)", lambda m: f"t={int(m[1]) + 1}", good.headers["Stripe-Signature"]
            )
            out["timestamp-changed"] = Delivery(good.body, {"Stripe-Signature": changed}, "")
        else:
            out["timestamp-changed"] = Delivery(
                good.body, {**good.headers, "X-Slack-Request-Timestamp": str(now + 1)}, ""
            )
    return out


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_preset_verifies_as_the_provider_does_and_dedupes_by_its_delivery_id(
    name: str, in_process: InProcess, db: psycopg.Connection
) -> None:
    in_process.publish(name, definition(name))
    secret = SECRETS[name]
    provider = PROVIDERS[name]
    # Before any secret exists, even a correctly signed delivery cannot pass.
    assert post(in_process, name, provider.deliver([secret])).status_code == 401
    add_secret(in_process, name, secret)

    good = provider.deliver([secret])
    assert provider.reference(secret, good)  # the provider agrees it is genuine
    first = post(in_process, name, good)
    assert first.status_code == 202, first.text
    execution_id = first.json()["execution_id"]
    stored = db.execute(
        "SELECT input, idempotency_key FROM executions WHERE id = %s", (execution_id,)
    ).fetchone()
    assert stored == (json.loads(good.body), good.identity)

    before = counts(db)
    for what, bad in tamperings(name, secret).items():
        r = post(in_process, name, bad)
        assert r.status_code == 401, (what, r.text)
        assert r.headers["Content-Type"] == "application/problem+json", what
        # Stripe's library checks only staleness; FlowForge also refuses a future stamp,
        # which no genuine delivery carries. The delivery-id headers are FlowForge's
        # identity, which the providers' signature checks do not look at.
        if (
            not (name == "stripe" and what == "future")
            and "Delivery" not in what
            and "Webhook-Id" not in what
        ):
            assert not provider.reference(secret, bad), f"the provider accepts {what}"
    assert counts(db) == before
    check_delivery_id_is_the_identity(name, in_process, db)


def check_delivery_id_is_the_identity(
    name: str, client: Api | InProcess, db: psycopg.Connection
) -> None:
    """A redelivery (re-signed later, Slack's retry header added) is the same execution,
    and no Idempotency-Key header can turn a captured delivery into a new one."""
    provider = PROVIDERS[name]
    good = provider.deliver([SECRETS[name]])
    first = post(client, name, good, **{"Idempotency-Key": "sender-1"})
    assert first.status_code == 202, first.text
    execution_id = first.json()["execution_id"]
    before = counts(db)
    again = provider.deliver([SECRETS[name]], good.body, int(time.time()) + 2)
    again.headers.update(
        {k: v for k, v in good.headers.items() if "Delivery" in k or "Webhook-Id" in k}
    )
    retries = [
        post(client, name, good),
        post(client, name, good, **{"Idempotency-Key": "another"}),
        post(
            client,
            name,
            again,
            **{"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"},
        ),
    ]
    for r in retries:
        assert r.status_code == 202, r.text
        assert r.headers["Idempotent-Replayed"] == "true"
        assert r.json()["execution_id"] == execution_id
    assert counts(db) == before
    assert good.identity in {k for (k,) in db.execute("SELECT key FROM idempotency_keys")}
    # A second, distinct delivery is a second execution.
    assert (
        post(client, name, provider.deliver([SECRETS[name]])).json()["execution_id"] != execution_id
    )


def test_stripe_rotation_several_v1_and_revocation(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    """While a Stripe secret is rolled, deliveries carry one v1 per secret; either active
    secret verifies, and a revoked one no longer does."""
    in_process.publish("stripe", definition("stripe"))
    old = SECRETS["stripe"]
    new = "whsec_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4"
    old_id = add_secret(in_process, "stripe", old)
    assert post(in_process, "stripe", stripe_delivery([new])).status_code == 401  # not known yet
    both = stripe_delivery([new, old])
    assert stripe_accepts(old, both) and stripe_accepts(new, both)
    assert post(in_process, "stripe", both).status_code == 202  # the v1 made with `old` counts
    add_secret(in_process, "stripe", new)
    for signers in ([new, old], [old], [new], [OTHER_SECRET, new]):
        r = post(in_process, "stripe", stripe_delivery(signers))
        assert r.status_code == 202, (signers, r.text)
    r = in_process.delete(f"/api/v1/workflows/stripe/webhook-secrets/{old_id}")
    assert r.status_code == 204
    before = counts(db)
    assert post(in_process, "stripe", stripe_delivery([old])).status_code == 401
    assert counts(db) == before
    assert post(in_process, "stripe", stripe_delivery([new])).status_code == 202


def test_slack_url_verification_is_answered_and_starts_nothing(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    in_process.publish("slack", definition("slack"))
    add_secret(in_process, "slack", SECRETS["slack"])
    body = json.dumps(
        {
            "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
            "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
            "type": "url_verification",
        }
    ).encode()
    before = counts(db)
    challenge = slack_delivery([SECRETS["slack"]], body)
    assert slack_accepts(SECRETS["slack"], challenge)
    r = post(in_process, "slack", challenge)
    assert r.status_code == 200, r.text
    assert r.json() == {"challenge": json.loads(body)["challenge"]}
    # Unsigned, the challenge is refused like any other request.
    forged = slack_delivery([OTHER_SECRET], body)
    assert post(in_process, "slack", forged).status_code == 401
    assert counts(db) == before


def test_github_published_vector(in_process: InProcess, db: psycopg.Connection) -> None:
    """GitHub's documented example: secret "It's a Secret to Everybody", payload
    "Hello, World!". FlowForge checks the signature first: the vector verifies (and its
    payload, no JSON, is then a 400); one changed byte is a 401."""
    published = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert github_header("It's a Secret to Everybody", b"Hello, World!") == published
    in_process.publish("gh", definition("github"))
    add_secret(in_process, "gh", "It's a Secret to Everybody")
    headers = {"X-Hub-Signature-256": published, "X-GitHub-Delivery": str(uuid.uuid4())}
    before = counts(db)
    vector = post(in_process, "gh", Delivery(b"Hello, World!", headers, ""))
    assert vector.status_code == 400 and vector.json()["title"] == "Malformed JSON", vector.text
    changed = post(in_process, "gh", Delivery(b"Hello, World?", headers, ""))
    assert changed.status_code == 401, changed.text
    assert counts(db) == before


def reads(base: str) -> float:
    text = requests.get(f"{base}/metrics", timeout=10).text
    match = re.search(r"^flowforge_intake_target_reads_total (\S+)$", text, re.M)
    assert match, "flowforge_intake_target_reads_total not exported"
    return float(match[1])


def test_one_database_read_at_most_per_verification(
    env: dict[str, str], tmp_path: Path, api_key: str, db: psycopg.Connection
) -> None:
    """A verified webhook reads its target from the process's cache; a refused one reads
    it once (the cache may be behind a new secret) and never more; a new secret or a
    revocation is honoured at once."""
    proc, base = start_api(env, tmp_path / "api.log", workers=1)
    try:
        client = Api(base, api_key)
        client.publish("gh", definition("github"))
        secret_id = add_secret(client, "gh", SECRETS["github"])
        assert post(client, "gh", github_delivery([SECRETS["github"]])).status_code == 202
        start = reads(base)
        for _ in range(10):
            assert post(client, "gh", github_delivery([SECRETS["github"]])).status_code == 202
        assert reads(base) == start  # from the cache
        for _ in range(10):
            assert post(client, "gh", github_delivery([OTHER_SECRET])).status_code == 401
        assert reads(base) - start <= 10
        # A secret added after the cache was filled verifies on the first try.
        add_secret(client, "gh", OTHER_SECRET)
        assert post(client, "gh", github_delivery([OTHER_SECRET])).status_code == 202
        r = client.delete(f"/api/v1/workflows/gh/webhook-secrets/{secret_id}")
        assert r.status_code == 204
        assert post(client, "gh", github_delivery([SECRETS["github"]])).status_code == 401
    finally:
        proc.stop()


def test_supplied_secrets_are_checked(in_process: InProcess) -> None:
    in_process.publish("std", {**definition("signature")})
    for bad in ({"value": "short"}, {"value": 5}, {"other": "x" * 20}, ["x" * 20]):
        r = in_process.post("/api/v1/workflows/std/webhook-secrets", bad)
        assert r.status_code == 422, (bad, r.text)
    # A Standard Webhooks workflow needs whsec_ + base64; a generated one still comes back.
    assert (
        in_process.post("/api/v1/workflows/std/webhook-secrets", {"value": "x" * 20}).status_code
        == 422
    )
    made = in_process.post("/api/v1/workflows/std/webhook-secrets")
    assert made.status_code == 201 and made.json()["secret"].startswith("whsec_")
