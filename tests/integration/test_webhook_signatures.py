"""Signed webhooks (docs/contract.md#webhook-auth, Standard Webhooks): only a holder of an active
secret can start a workflow, a refused call writes nothing, and secrets rotate without downtime.

Every signature here is made by `sign()` below — hmac + base64 from the standard library,
written from the Standard Webhooks description — never by flowforge.trust.signatures, so a bug
in FlowForge's signer and verifier cannot cancel itself out.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from tests.support.api import Api
from tests.support.problems import PROBLEM, assert_problem
from tests.support.processes import TEST_ENCRYPTION_KEY
from tests.support.webhooks import sign

FLOWFORGE = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "flowforge"

# No trigger at all: signature verification is the default and must not need opting into.
SIGNED = {
    "name": "Signed intake",
    "steps": [{"id": "shape", "type": "transform", "output": {"order": "{{ input.order }}"}}],
}


def signed_headers(
    secret: str, body: bytes, msg_id: str | None = None, timestamp: int | None = None
) -> dict[str, str]:
    """The three Standard Webhooks headers for `body`, plus the JSON content type."""
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def counts(db: psycopg.Connection) -> dict[str, int]:
    """Rows an accepted webhook writes: if these do not move, the call created nothing."""
    return {
        table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        for table in ("executions", "steps", "outbox", "idempotency_keys", "execution_events")
    }


class Hooks:
    """The in-process API as a webhook sender and an operator would use it."""

    def __init__(self, client: Any, api_key: str) -> None:
        self.client = client
        self.auth = {"Authorization": f"Bearer {api_key}"}

    def publish(self, key: str, definition: dict[str, Any]) -> None:
        r = self.client.post(
            f"/api/v1/workflows/{key}/versions", json=definition, headers=self.auth
        )
        assert r.status_code == 201, r.get_data(as_text=True)

    def new_secret(self, key: str) -> tuple[int, str]:
        r = self.client.post(f"/api/v1/workflows/{key}/webhook-secrets", headers=self.auth)
        assert r.status_code == 201, r.get_data(as_text=True)
        created = r.get_json()
        assert created["secret"].startswith("whsec_")
        return created["id"], created["secret"]

    def revoke(self, key: str, secret_id: int) -> None:
        r = self.client.delete(
            f"/api/v1/workflows/{key}/webhook-secrets/{secret_id}", headers=self.auth
        )
        assert r.status_code == 204, r.get_data(as_text=True)

    def post(self, key: str, body: bytes, headers: dict[str, str]) -> Any:
        return self.client.post(f"/hooks/{key}", data=body, headers=headers)


@pytest.fixture
def hooks(app_client: Any, api_key: str) -> Hooks:
    return Hooks(app_client, api_key)


@pytest.fixture
def secret(hooks: Hooks) -> str:
    """The `orders` workflow, published without a trigger, and one active secret."""
    hooks.publish("orders", SIGNED)
    return hooks.new_secret("orders")[1]


BODY = b'{"order": "A-1",  "note": "raw bytes, odd spacing kept"}'


def test_default_auth_is_signature_and_unsigned_calls_create_nothing(
    hooks: Hooks, db: psycopg.Connection
) -> None:
    """Without a trigger and without any secret, an unsigned call is 401 and writes nothing."""
    hooks.publish("orders", SIGNED)
    before = counts(db)
    r = hooks.post("orders", BODY, {"Content-Type": "application/json"})
    assert "webhook-id" in assert_problem(r, 401)["detail"]
    # Even a correctly formed signature cannot help while the workflow has no secret at all.
    made_up = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    assert_problem(hooks.post("orders", BODY, signed_headers(made_up, BODY)), 401)
    assert counts(db) == before
    version = hooks.client.get("/api/v1/workflows/orders/versions/1", headers=hooks.auth)
    assert version.get_json()["webhook_auth"] == "signature"


def test_valid_signature_is_accepted_over_the_raw_bytes(
    hooks: Hooks, secret: str, db: psycopg.Connection
) -> None:
    """Signed over the exact bytes (odd spacing included): nothing is re-serialised."""
    before = counts(db)
    r = hooks.post("orders", BODY, signed_headers(secret, BODY))
    assert r.status_code == 202, r.get_data(as_text=True)
    execution_id = r.get_json()["execution_id"]
    assert r.headers["Location"] == f"/api/v1/executions/{execution_id}"
    after = counts(db)
    assert after["executions"] == before["executions"] + 1
    assert after["outbox"] == before["outbox"] + 1
    stored = db.execute("SELECT input FROM executions WHERE id = %s", (execution_id,)).fetchone()
    assert stored[0] == json.loads(BODY)


def test_several_signatures_in_one_header_any_valid_one_counts(hooks: Hooks, secret: str) -> None:
    """Senders may list several signatures (and future versions); one valid v1 is enough."""
    headers = signed_headers(secret, BODY)
    other = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    wrong = sign(other, headers["webhook-id"], headers["webhook-timestamp"], BODY)
    headers["webhook-signature"] = f"v2,abc {wrong} {headers['webhook-signature']}"
    assert hooks.post("orders", BODY, headers).status_code == 202


@pytest.mark.parametrize(
    "tamper",
    [
        lambda body: body + b" ",
        lambda body: body.replace(b"  ", b" "),
        lambda body: body.replace(b"A-1", b"A-2"),
    ],
    ids=["trailing-space", "one-whitespace-byte-removed", "value-changed"],
)
def test_tampered_body_is_refused(
    hooks: Hooks, secret: str, db: psycopg.Connection, tamper
) -> None:
    before = counts(db)
    headers = signed_headers(secret, BODY)
    tampered = tamper(BODY)
    assert tampered != BODY and json.loads(tampered) is not None
    assert_problem(hooks.post("orders", tampered, headers), 401)
    assert counts(db) == before


def test_wrong_secret_is_refused(hooks: Hooks, secret: str, db: psycopg.Connection) -> None:
    before = counts(db)
    wrong = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    assert_problem(hooks.post("orders", BODY, signed_headers(wrong, BODY)), 401)
    # Right secret, but the signature covers a different id than the header says.
    headers = signed_headers(secret, BODY)
    headers["webhook-id"] = "msg_other"
    assert_problem(hooks.post("orders", BODY, headers), 401)
    assert counts(db) == before


@pytest.mark.parametrize(
    "offset", [-301, 301, -3600, 86_400], ids=["stale", "future", "hour", "day"]
)
def test_timestamps_outside_five_minutes_are_refused(
    hooks: Hooks, secret: str, db: psycopg.Connection, offset: int
) -> None:
    """Correctly signed, but outside the tolerance: an old capture cannot be replayed later."""
    before = counts(db)
    headers = signed_headers(secret, BODY, timestamp=int(time.time()) + offset)
    detail = assert_problem(hooks.post("orders", BODY, headers), 401)["detail"]
    assert "timestamp" in detail
    assert counts(db) == before


@pytest.mark.parametrize("offset", [-280, 280])
def test_timestamps_inside_the_tolerance_are_accepted(
    hooks: Hooks, secret: str, offset: int
) -> None:
    headers = signed_headers(secret, BODY, timestamp=int(time.time()) + offset)
    assert hooks.post("orders", BODY, headers).status_code == 202


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_each_missing_header_is_refused(
    hooks: Hooks, secret: str, db: psycopg.Connection, missing: str
) -> None:
    before = counts(db)
    headers = signed_headers(secret, BODY)
    del headers[missing]
    assert missing in assert_problem(hooks.post("orders", BODY, headers), 401)["detail"]
    assert counts(db) == before


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("webhook-timestamp", "1.5e9"),
        ("webhook-timestamp", "-1"),
        ("webhook-signature", "v1,not*base64"),
        ("webhook-signature", "v1,"),
        ("webhook-signature", "v2,c2lnbmF0dXJl"),
    ],
)
def test_malformed_headers_are_refused(
    hooks: Hooks, secret: str, db: psycopg.Connection, name: str, value: str
) -> None:
    before = counts(db)
    headers = {**signed_headers(secret, BODY), name: value}
    assert_problem(hooks.post("orders", BODY, headers), 401)
    assert counts(db) == before


def test_rotation_two_active_secrets_third_is_conflict(hooks: Hooks, secret: str) -> None:
    """During a rotation both secrets sign; a third is refused until one is revoked."""
    second_id, second = hooks.new_secret("orders")
    assert hooks.post("orders", BODY, signed_headers(secret, BODY)).status_code == 202
    assert hooks.post("orders", BODY, signed_headers(second, BODY)).status_code == 202
    third = hooks.client.post("/api/v1/workflows/orders/webhook-secrets", headers=hooks.auth)
    assert_problem(third, 409)
    listing = hooks.client.get("/api/v1/workflows/orders/webhook-secrets", headers=hooks.auth)
    items = listing.get_json()["items"]
    assert len(items) == 2 and all(item["revoked_at"] is None for item in items)
    assert secret not in listing.get_data(as_text=True)
    assert second not in listing.get_data(as_text=True)
    # Finishing the rotation frees a slot again.
    hooks.revoke("orders", second_id)
    hooks.new_secret("orders")


def test_revoked_secret_is_refused_and_stops_idempotent_replay(
    hooks: Hooks, db: psycopg.Connection
) -> None:
    """After revocation even an exact replay of an accepted call is 401, not a 202 replay."""
    hooks.publish("orders", SIGNED)
    old_id, old = hooks.new_secret("orders")
    _, new = hooks.new_secret("orders")
    accepted_headers = signed_headers(old, BODY)
    first = hooks.post("orders", BODY, accepted_headers)
    assert first.status_code == 202
    hooks.revoke("orders", old_id)
    before = counts(db)
    replay = hooks.post("orders", BODY, accepted_headers)
    assert_problem(replay, 401)
    assert "Idempotent-Replayed" not in replay.headers
    assert first.get_json()["execution_id"] not in replay.get_data(as_text=True)
    assert_problem(hooks.post("orders", BODY, signed_headers(old, BODY)), 401)
    assert counts(db) == before
    # The surviving secret keeps working: rotation without downtime.
    assert hooks.post("orders", BODY, signed_headers(new, BODY)).status_code == 202


def test_replayed_webhook_id_returns_the_same_execution(
    hooks: Hooks, secret: str, db: psycopg.Connection
) -> None:
    """webhook-id doubles as the idempotency key: a redelivery is not a second execution."""
    msg_id = f"msg_{uuid.uuid4().hex}"
    first = hooks.post("orders", BODY, signed_headers(secret, BODY, msg_id))
    assert first.status_code == 202
    assert "Idempotent-Replayed" not in first.headers
    before = counts(db)
    # A sender retrying later signs again with a fresh timestamp but the same id.
    later = signed_headers(secret, BODY, msg_id, int(time.time()) + 5)
    again = hooks.post("orders", BODY, later)
    assert again.status_code == 202
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["execution_id"] == first.get_json()["execution_id"]
    assert counts(db) == before
    # The same id with another body is a conflict, even though it is correctly signed.
    other = BODY.replace(b"A-1", b"B-2")
    assert_problem(hooks.post("orders", other, signed_headers(secret, other, msg_id)), 409)
    assert counts(db) == before


def test_an_added_idempotency_key_cannot_turn_a_replay_into_a_new_execution(
    hooks: Hooks, secret: str, db: psycopg.Connection
) -> None:
    """Idempotency-Key is not signed: for a signed workflow the signed webhook-id alone is
    the identity, so a captured request resent with any Idempotency-Key is a replay."""
    msg_id = f"msg_{uuid.uuid4().hex}"
    captured = signed_headers(secret, BODY, msg_id)
    first = hooks.post("orders", BODY, {**captured, "Idempotency-Key": "sender-1"})
    assert first.status_code == 202
    execution_id = first.get_json()["execution_id"]
    before = counts(db)
    for added in ("x1", "x2", "sender-1", "k" * 300, "\t"):
        again = hooks.post("orders", BODY, {**captured, "Idempotency-Key": added})
        assert again.status_code == 202, again.get_data(as_text=True)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.get_json()["execution_id"] == execution_id
    plain = hooks.post("orders", BODY, captured)
    assert plain.headers["Idempotent-Replayed"] == "true"
    assert plain.get_json()["execution_id"] == execution_id
    # The same webhook-id with another (validly signed) body stays a conflict.
    other = BODY.replace(b"A-1", b"B-2")
    resigned = {**signed_headers(secret, other, msg_id), "Idempotency-Key": "fresh"}
    assert_problem(hooks.post("orders", other, resigned), 409)
    assert counts(db) == before
    (stored,) = db.execute("SELECT key FROM idempotency_keys").fetchone()
    assert stored == msg_id


def test_unsigned_workflow_must_say_none_explicitly(hooks: Hooks, db: psycopg.Connection) -> None:
    hooks.publish("open", {**SIGNED, "trigger": {"webhook": {"auth": "none"}}})
    assert hooks.post("open", BODY, {"Content-Type": "application/json"}).status_code == 202
    hooks.publish("explicit", {**SIGNED, "trigger": {"webhook": {"auth": "signature"}}})
    assert_problem(hooks.post("explicit", BODY, {"Content-Type": "application/json"}), 401)


# --- through the real bin/api, with a secret made by the CLI ---------------------------


def cli(database_url: str, *args: str) -> str:
    """Run the installed `flowforge` console script; return its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")}
    done = subprocess.run(
        [str(FLOWFORGE), *args],
        env={
            **env,
            "FLOWFORGE_DATABASE_URL": database_url,
            "FLOWFORGE_ENCRYPTION_KEY": TEST_ENCRYPTION_KEY,
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_signed_webhooks_through_bin_api_with_cli_secrets(
    api: str, api_key: str, database_url: str, db: psycopg.Connection
) -> None:
    """The whole chain as deployed: CLI makes the secret, gunicorn verifies, rotation, revoke."""
    client = Api(api, api_key)
    client.publish("orders", SIGNED)
    first = cli(database_url, "secret", "create", "orders").strip().splitlines()[-1]
    assert first.startswith("whsec_")
    url = f"{api}/hooks/orders"

    accepted = requests.post(url, data=BODY, headers=signed_headers(first, BODY), timeout=10)
    assert accepted.status_code == 202, accepted.text
    before = counts(db)
    unsigned = requests.post(
        url, data=BODY, headers={"Content-Type": "application/json"}, timeout=10
    )
    assert unsigned.status_code == 401
    assert unsigned.headers["Content-Type"] == PROBLEM
    tampered = requests.post(
        url, data=BODY + b"\n", headers=signed_headers(first, BODY), timeout=10
    )
    assert tampered.status_code == 401
    assert counts(db) == before

    # Rotate: the new secret comes from the API, the old one is revoked by the CLI.
    second = client.post("/api/v1/workflows/orders/webhook-secrets")
    assert second.status_code == 201
    new = second.json()["secret"]
    assert (
        requests.post(url, data=BODY, headers=signed_headers(new, BODY), timeout=10).status_code
        == 202
    )
    first_id = db.execute("SELECT min(id) FROM webhook_secrets").fetchone()[0]
    cli(database_url, "secret", "revoke", "orders", str(first_id))
    old = requests.post(url, data=BODY, headers=signed_headers(first, BODY), timeout=10)
    assert old.status_code == 401
    assert (
        requests.post(url, data=BODY, headers=signed_headers(new, BODY), timeout=10).status_code
        == 202
    )
