"""What a flood costs the intake (issue 22 item 11, issue 29's "one read per verification"),
against real bin/api processes: forged signatures re-read a workflow's or a source's
secrets at most once per second per process (intake.RECHECK_INTERVAL_S), rotation is
still honoured, and the default per-workflow rate limit answers 429 before any database
work. Reads are counted by flowforge_intake_target_reads_total, incremented next to the
one query that reads a target (aggregated over the gunicorn workers by /metrics)."""

from __future__ import annotations

import base64
import json
import math
import re
import time
import uuid
from pathlib import Path
from typing import Any

import requests

from flowforge.usecases import intake
from tests.support.api import Api
from tests.support.definitions import transform, workflow
from tests.support.processes import start_api, wait_for
from tests.support.webhooks import github_header, shopify_header, sign, slack_header, stripe_header

WORKERS = 2
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER = "whsec_" + base64.b64encode(b"a secret nobody gave FlowForge!!").decode()
PRESET_SECRET = "a-secret-of-twenty-characters-or-more"
FORGED = 100


def definition(auth: str) -> dict[str, Any]:
    return workflow(transform("keep", {"got": "{{ input }}"}), auth=auth, name=f"{auth} flood")


def signed(auth: str, secret: str, body: bytes) -> dict[str, str]:
    """Headers a sender holding `secret` sends for `body` under preset `auth`."""
    now = int(time.time())
    headers = {"Content-Type": "application/json"}
    if auth == "signature":
        msg_id = f"msg_{uuid.uuid4().hex}"
        headers |= {
            "webhook-id": msg_id,
            "webhook-timestamp": str(now),
            "webhook-signature": sign(secret, msg_id, now, body),
        }
    elif auth == "stripe":
        headers["Stripe-Signature"] = stripe_header([secret], now, body)
    elif auth == "github":
        headers |= {
            "X-Hub-Signature-256": github_header(secret, body),
            "X-GitHub-Delivery": str(uuid.uuid4()),
        }
    elif auth == "shopify":
        headers |= {
            "X-Shopify-Hmac-Sha256": shopify_header(secret, body),
            "X-Shopify-Webhook-Id": str(uuid.uuid4()),
        }
    else:
        headers |= {
            "X-Slack-Request-Timestamp": str(now),
            "X-Slack-Signature": slack_header(secret, now, body),
        }
    return headers


def body_for(auth: str) -> bytes:
    """A body each preset accepts as an event (Stripe's and Slack's carry their id)."""
    event = uuid.uuid4().hex
    if auth == "stripe":
        return json.dumps({"id": f"evt_{event}", "object": "event"}).encode()
    if auth == "slack":
        return json.dumps({"type": "event_callback", "event_id": f"Ev{event[:10]}"}).encode()
    return json.dumps({"n": event}).encode()


def reads(base: str) -> float:
    text = requests.get(f"{base}/metrics", timeout=10).text
    match = re.search(r"^flowforge_intake_target_reads_total (\S+)$", text, re.M)
    assert match, "flowforge_intake_target_reads_total not exported"
    return float(match[1])


def flood(session: requests.Session, url: str, auth: str, count: int) -> tuple[float, list[int]]:
    """`count` forged deliveries (signed with a secret FlowForge does not hold); returns
    the seconds they took and their statuses."""
    started = time.monotonic()
    codes = []
    for _ in range(count):
        body = body_for(auth)
        codes.append(session.post(url, data=body, headers=signed(auth, OTHER, body)).status_code)
    return time.monotonic() - started, codes


def bound(seconds: float) -> int:
    """Re-reads a flood of `seconds` may cost: per process, a burst, then one a second."""
    return WORKERS * (intake.RECHECK_BURST + math.ceil(seconds / intake.RECHECK_INTERVAL_S) + 1)


def test_forged_floods_are_bounded_for_every_preset_and_source_and_rotation_holds(
    env: dict[str, str], tmp_path: Path, api_key: str
) -> None:
    """One bin/api for the three parts (a start costs seconds): each preset's flood, a
    source's flood, then rotation during a flood."""
    proc, base = start_api(env, tmp_path / "api.log", workers=WORKERS)
    try:
        client = Api(base, api_key)
        presets_are_bounded(base, client)
        a_source_is_bounded(base, client)
        rotation_is_honoured_during_a_flood(base, client)
    finally:
        proc.stop()


def presets_are_bounded(base: str, client: Api) -> None:
    session = requests.Session()
    for auth in ("signature", "stripe", "github", "shopify", "slack"):
        key = f"flood-{auth}"
        client.publish(key, definition(auth))
        value = SECRET if auth == "signature" else PRESET_SECRET
        r = client.post(f"/api/v1/workflows/{key}/webhook-secrets", {"value": value})
        assert r.status_code == 201, r.text
        body = body_for(auth)
        ok = session.post(f"{base}/hooks/{key}", data=body, headers=signed(auth, value, body))
        assert ok.status_code == 202, ok.text
        start = reads(base)
        seconds, codes = flood(session, f"{base}/hooks/{key}", auth, FORGED)
        assert set(codes) == {401}
        spent = reads(base) - start
        print(f"{auth}: {FORGED} forged in {seconds:.2f}s cost {spent:.0f} target reads")
        assert spent <= bound(seconds), (auth, spent, seconds)


def a_source_is_bounded(base: str, client: Api) -> None:
    client.publish("routed", definition("none"))
    r = client.post("/api/v1/sources/gh-flood", {"auth": "github", "subscriptions": [
        {"workflow": "routed"}]})  # fmt: skip
    assert r.status_code == 200, r.text
    r = client.post("/api/v1/sources/gh-flood/webhook-secrets", {"value": PRESET_SECRET})
    assert r.status_code == 201, r.text
    start = reads(base)
    seconds, codes = flood(requests.Session(), f"{base}/hooks/gh-flood", "github", FORGED)
    assert set(codes) == {401}
    spent = reads(base) - start
    print(f"source: {FORGED} forged in {seconds:.2f}s cost {spent:.0f} reads")
    assert spent <= bound(seconds), (spent, seconds)


def rotation_is_honoured_during_a_flood(base: str, client: Api) -> None:
    """A secret added while forgeries arrive verifies within the recheck interval on every
    process (at once on the process that added it); a revoked one stops at once."""
    client.publish("rotating", definition("signature"))
    r = client.post("/api/v1/workflows/rotating/webhook-secrets", {"value": SECRET})
    old_id = r.json()["id"]
    session = requests.Session()
    url = f"{base}/hooks/rotating"

    def post(secret: str) -> int:
        body = body_for("signature")
        return session.post(url, data=body, headers=signed("signature", secret, body)).status_code

    assert post(SECRET) == 202
    flood(session, url, "signature", 50)
    r = client.post("/api/v1/workflows/rotating/webhook-secrets", {"value": OTHER})
    assert r.status_code == 201, r.text
    # Every process sees it once its last re-read is a second old; the flood goes on.
    wait_for(lambda: all(post(OTHER) == 202 for _ in range(4 * WORKERS)), timeout=10)
    r = client.session.delete(f"{base}/api/v1/workflows/rotating/webhook-secrets/{old_id}")
    assert r.status_code == 204
    # Refused by the intake statement itself, whatever a process has cached.
    assert {post(SECRET) for _ in range(4 * WORKERS)} == {401}


def test_the_rate_limit_answers_429_before_any_database_work(
    env: dict[str, str], tmp_path: Path, api_key: str
) -> None:
    """Past FLOWFORGE_WEBHOOK_RATE (100 unless set: test_config.py) one workflow key gets
    a problem 429 with Retry-After, answered before the body is read or the database
    asked (hooks._receive), while another workflow and /healthz are served. A low rate
    here, so that the 429 does not depend on how fast this machine sends."""
    proc, base = start_api({**env, "FLOWFORGE_WEBHOOK_RATE": "5"}, tmp_path / "api.log", workers=1)
    try:
        client = Api(base, api_key)
        for key in ("limited", "quiet"):
            client.publish(key, definition("signature"))
            client.post(f"/api/v1/workflows/{key}/webhook-secrets", {"value": SECRET})
        session = requests.Session()
        url = f"{base}/hooks/limited"
        codes = []
        while 429 not in codes and len(codes) < 1000:
            body = body_for("signature")
            r = session.post(url, data=body, headers=signed("signature", OTHER, body))
            codes.append(r.status_code)
        assert codes[:5] == [401] * 5 and codes[-1] == 429  # the burst passes
        assert r.headers["Content-Type"] == "application/problem+json"
        assert int(r.headers["Retry-After"]) >= 1
        assert "FLOWFORGE_WEBHOOK_RATE" in r.json()["detail"]
        body = body_for("signature")
        quiet = session.post(
            f"{base}/hooks/quiet", data=body, headers=signed("signature", SECRET, body)
        )
        assert quiet.status_code == 202, quiet.text
        assert session.get(f"{base}/healthz").status_code == 200
    finally:
        proc.stop()
