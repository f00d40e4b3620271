"""Webhook signing secrets are sealed at rest (AES-256-GCM, key outside the database): a
pg_dump alone cannot forge a webhook, rotation keeps working, sealed rows cannot be swapped,
clear rows left from before migration 0004 are sealed by bin/migrate, and without the key
the API says so with a 503 problem instead of storing anything in clear."""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from flowforge.trust import sealing, signatures
from flowforge.trust.sealing import parse_key
from tests.integration.test_webhook_signatures import SIGNED, counts, signed_headers
from tests.support.api import Api
from tests.support.problems import PROBLEM, assert_problem
from tests.support.processes import ROOT, TEST_ENCRYPTION_KEY, run_migrate

BODY = b'{"order": "A-1"}'


def pg_dump(database_url: str) -> str:
    """Everything PostgreSQL holds for this database, as text (bytea shows as hex)."""
    return subprocess.run(
        ["pg_dump", "-d", database_url], capture_output=True, text=True, timeout=60, check=True
    ).stdout


def forms(secret: str) -> list[str]:
    """Every spelling of a signing secret a dump could show: the text, its key bytes in
    base64 and in hex (how pg_dump writes bytea), and the text's own bytes in hex."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    return [secret, secret.removeprefix("whsec_"), key.hex(), secret.encode().hex()]


def app_with_key(database_url: str, key: bytes | None) -> Iterator[Any]:
    from flowforge.api import create_app
    from flowforge.store.config import Settings

    app = create_app(Settings(database_url=database_url, encryption_key=key))
    app.extensions["flowforge.pool"].wait(timeout=10)
    yield app.test_client()
    app.extensions["flowforge.pool"].close()


@pytest.fixture
def keyless(database_url: str) -> Iterator[Any]:
    """The in-process app of a server started without FLOWFORGE_ENCRYPTION_KEY."""
    yield from app_with_key(database_url, None)


@pytest.fixture
def other_key(database_url: str) -> Iterator[Any]:
    """The in-process app of a server started with another key than the one that sealed."""
    yield from app_with_key(database_url, parse_key(sealing.new_key()))


def test_a_dump_holds_no_secret_and_rotation_still_verifies(
    api: str, api_key: str, database_url: str, db: psycopg.Connection
) -> None:
    """Through the real bin/api: two secrets (a rotation), both verify, neither is in the dump."""
    client = Api(api, api_key)
    client.publish("orders", SIGNED)
    made = [client.post("/api/v1/workflows/orders/webhook-secrets") for _ in range(2)]
    assert [r.status_code for r in made] == [201, 201]
    secrets = [r.json()["secret"] for r in made]
    for secret in secrets:
        accepted = client.hook("orders", None, raw=BODY, headers=signed_headers(secret, BODY))
        assert accepted.status_code == 202, accepted.text
    dump = pg_dump(database_url)
    assert "webhook_secrets" in dump
    for secret in secrets:
        for form in forms(secret):
            assert form not in dump
    # The rows really hold sealed values, not some other clear column.
    rows = db.execute("SELECT secret, sealed FROM webhook_secrets ORDER BY id").fetchall()
    assert [secret for secret, _ in rows] == [None, None]
    assert all(len(sealed) > 32 for _, sealed in rows)
    # Rotation ends: revoke the first; the second alone still verifies.
    first_id = made[0].json()["id"]
    revoked = client.session.delete(
        f"{api}/api/v1/workflows/orders/webhook-secrets/{first_id}", timeout=10
    )
    assert revoked.status_code == 204
    old = client.hook("orders", None, raw=BODY, headers=signed_headers(secrets[0], BODY))
    assert old.status_code == 401
    new = client.hook("orders", None, raw=BODY, headers=signed_headers(secrets[1], BODY))
    assert new.status_code == 202


def publish_with_secret(client: Any, api_key: str, workflow: str) -> tuple[int, str]:
    auth = {"Authorization": f"Bearer {api_key}"}
    r = client.post(f"/api/v1/workflows/{workflow}/versions", json=SIGNED, headers=auth)
    assert r.status_code == 201
    r = client.post(f"/api/v1/workflows/{workflow}/webhook-secrets", headers=auth)
    assert r.status_code == 201, r.get_data(as_text=True)
    return r.get_json()["id"], r.get_json()["secret"]


def test_a_sealed_value_copied_to_another_row_does_not_open(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    """Whoever can write the table cannot move workflow a's secret onto workflow b."""
    a_id, a_secret = publish_with_secret(app_client, api_key, "a")
    b_id, _ = publish_with_secret(app_client, api_key, "b")
    db.execute(
        "UPDATE webhook_secrets SET sealed = (SELECT sealed FROM webhook_secrets WHERE id = %s)"
        " WHERE id = %s",
        (a_id, b_id),
    )
    before = counts(db)
    r = app_client.post("/hooks/b", data=BODY, headers=signed_headers(a_secret, BODY))
    assert "decrypted" in assert_problem(r, 503)["detail"]
    assert counts(db) == before
    # The untouched row still opens.
    r = app_client.post("/hooks/a", data=BODY, headers=signed_headers(a_secret, BODY))
    assert r.status_code == 202


def test_without_the_key_secrets_are_refused_and_signed_intake_is_a_503(
    app_client: Any, keyless: Any, api_key: str, db: psycopg.Connection
) -> None:
    """Nothing is stored in clear for want of a key, and the sender is told it is the
    server's fault (503), not theirs (401); unsigned workflows are unaffected."""
    _, secret = publish_with_secret(app_client, api_key, "orders")
    auth = {"Authorization": f"Bearer {api_key}"}
    stored = db.execute("SELECT count(*) FROM webhook_secrets").fetchone()[0]
    refused = keyless.post("/api/v1/workflows/orders/webhook-secrets", headers=auth)
    assert "FLOWFORGE_ENCRYPTION_KEY" in assert_problem(refused, 503)["detail"]
    assert db.execute("SELECT count(*) FROM webhook_secrets").fetchone()[0] == stored
    before = counts(db)
    r = keyless.post("/hooks/orders", data=BODY, headers=signed_headers(secret, BODY))
    assert "FLOWFORGE_ENCRYPTION_KEY" in assert_problem(r, 503)["detail"]
    assert counts(db) == before
    open_definition = {**SIGNED, "trigger": {"webhook": {"auth": "none"}}}
    keyless.post("/api/v1/workflows/open/versions", json=open_definition, headers=auth)
    r = keyless.post("/hooks/open", data=BODY, headers={"Content-Type": "application/json"})
    assert r.status_code == 202


def test_the_cli_refuses_to_create_a_secret_without_the_key(
    app_client: Any, api_key: str, database_url: str, db: psycopg.Connection
) -> None:
    auth = {"Authorization": f"Bearer {api_key}"}
    assert app_client.post("/api/v1/workflows/orders/versions", json=SIGNED, headers=auth)
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "flowforge"), "secret", "create", "orders"],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")},
            "FLOWFORGE_DATABASE_URL": database_url,
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert "FLOWFORGE_ENCRYPTION_KEY" in done.stderr
    assert "whsec_" not in done.stdout
    assert db.execute("SELECT count(*) FROM webhook_secrets").fetchone()[0] == 0


def test_another_key_cannot_open_the_secrets(
    app_client: Any, other_key: Any, api_key: str, db: psycopg.Connection
) -> None:
    _, secret = publish_with_secret(app_client, api_key, "orders")
    before = counts(db)
    r = other_key.post("/hooks/orders", data=BODY, headers=signed_headers(secret, BODY))
    assert_problem(r, 503)
    assert counts(db) == before


def migrate(database_url: str, key: str) -> subprocess.CompletedProcess[str]:
    return run_migrate(
        {
            **{k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")},
            "FLOWFORGE_DATABASE_URL": database_url,
            "FLOWFORGE_ENCRYPTION_KEY": key,
        }
    )


def test_bin_migrate_seals_secrets_left_in_clear(
    app_client: Any, api_key: str, database_url: str, db: psycopg.Connection
) -> None:
    """A row as it stood before 0004 (clear value only) is sealed by bin/migrate with the
    key, refused loudly without it, and verifies afterwards; the dump no longer has it."""
    auth = {"Authorization": f"Bearer {api_key}"}
    assert app_client.post("/api/v1/workflows/orders/versions", json=SIGNED, headers=auth)
    legacy = signatures.new_secret()
    db.execute(
        "INSERT INTO webhook_secrets (workflow_id, secret)"
        " SELECT id, %s FROM workflows WHERE key = 'orders'",
        (legacy,),
    )
    # An unsealed secret is not used: it would keep the clear column alive.
    r = app_client.post("/hooks/orders", data=BODY, headers=signed_headers(legacy, BODY))
    assert_problem(r, 401)

    without = migrate(database_url, "")
    assert without.returncode == 1
    assert "FLOWFORGE_ENCRYPTION_KEY" in without.stderr
    assert db.execute("SELECT secret FROM webhook_secrets").fetchone()[0] == legacy

    done = migrate(database_url, TEST_ENCRYPTION_KEY)
    assert done.returncode == 0, done.stderr
    assert "sealed 1" in done.stdout
    assert db.execute("SELECT secret FROM webhook_secrets").fetchone()[0] is None
    for form in forms(legacy):
        assert form not in pg_dump(database_url)
    r = app_client.post("/hooks/orders", data=BODY, headers=signed_headers(legacy, BODY))
    assert r.status_code == 202, r.get_data(as_text=True)
    # Nothing left to seal: a second run is quiet and succeeds.
    again = migrate(database_url, TEST_ENCRYPTION_KEY)
    assert again.returncode == 0 and "sealed" not in again.stdout


def test_bin_api_without_key_answers_problem_json(
    api_key: str, env: dict[str, str], tmp_path: Path
) -> None:
    """The real server started without a key: secret creation is a 503 problem document."""
    from tests.support.processes import start_api

    proc, base = start_api({**env, "FLOWFORGE_ENCRYPTION_KEY": ""}, tmp_path / "api.log", 1)
    try:
        client = Api(base, api_key)
        client.publish("orders", SIGNED)
        r = client.post("/api/v1/workflows/orders/webhook-secrets")
        assert r.status_code == 503
        assert r.headers["Content-Type"] == PROBLEM
        assert "FLOWFORGE_ENCRYPTION_KEY" in r.json()["detail"]
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
    finally:
        proc.stop()
