"""API keys: shown once, stored only as SHA-256, scoped to workflows and to read-only use,
and revoked from the very next request on."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from flowforge.store import apikeys
from tests.support.definitions import OPEN
from tests.support.problems import PROBLEM, assert_problem

FLOWFORGE = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "flowforge"
KEY = re.compile(r"ff_[0-9a-f]{64}")


def cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed console script against the test database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")}
    return subprocess.run(
        [str(FLOWFORGE), *args],
        env={**env, "FLOWFORGE_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=30,
    )


def create_with_cli(database_url: str, *args: str) -> str:
    """`flowforge apikey create ...`; the key is the last line of its output."""
    done = cli(database_url, "apikey", "create", *args)
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip().splitlines()[-1]
    assert KEY.fullmatch(key), done.stdout
    return key


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def world(app_client: Any, api_key: str) -> dict[str, str]:
    """Workflows a and b, each with one execution, made with the all-powerful fixture key."""
    ids = {}
    for key in ("a", "b"):
        r = app_client.post(f"/api/v1/workflows/{key}/versions", json=OPEN, headers=bearer(api_key))
        assert r.status_code == 201
        r = app_client.post(f"/hooks/{key}", json={"x": key})
        assert r.status_code == 202
        ids[key] = r.get_json()["execution_id"]
    return ids


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Bearer garbage",
        "Bearer ff_" + "0" * 64,
        "Bearer ff_' OR 1=1 --",
        "Bearer " + "ff_" + "a" * 10_000,
    ],
    ids=["missing", "empty", "no-token", "blank", "basic", "garbage", "unknown", "sql", "long"],
)
def test_missing_or_garbage_key_is_401(app_client: Any, api_key: str, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    for path in ("/api/v1/workflows", "/api/v1/executions"):
        r = app_client.get(path, headers=headers)
        assert_problem(r, 401)
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert_problem(app_client.post("/api/v1/workflows/a/versions", json=OPEN, headers=headers), 401)


def test_cli_key_is_shown_once_and_listed_by_prefix(
    app_client: Any, database_url: str, db: psycopg.Connection
) -> None:
    key = create_with_cli(database_url, "--name", "x")
    assert app_client.get("/api/v1/workflows", headers=bearer(key)).status_code == 200
    listing = cli(database_url, "apikey", "list")
    assert listing.returncode == 0, listing.stderr
    assert key[:10] in listing.stdout and " x" in listing.stdout
    assert key not in listing.stdout
    assert key[10:20] not in listing.stdout


def test_keys_are_stored_only_as_sha256(
    app_client: Any, database_url: str, db: psycopg.Connection
) -> None:
    """Neither the key nor its hex body appear anywhere in a dump of api_keys."""
    key = create_with_cli(database_url, "--name", "dumped")
    app_client.get("/api/v1/workflows", headers=bearer(key))
    dump = subprocess.run(
        ["pg_dump", "--data-only", "--table=api_keys", "-d", database_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "dumped" in dump  # the dump did include the row
    assert key not in dump
    assert key.removeprefix("ff_") not in dump
    assert key[10:] not in dump
    (stored,) = db.execute("SELECT key_hash FROM api_keys WHERE name = 'dumped'").fetchone()
    assert bytes(stored) == hashlib.sha256(key.encode()).digest()


def test_revocation_takes_effect_on_the_next_request(
    api: str, database_url: str, db: psycopg.Connection
) -> None:
    """Across processes: the CLI revokes, the very next call to gunicorn is refused."""
    key = create_with_cli(database_url, "--name", "leaving")
    (key_id,) = db.execute("SELECT id FROM api_keys WHERE name = 'leaving'").fetchone()
    session = requests.Session()
    session.headers.update(bearer(key))
    # Warm every gunicorn worker's pool, so no answer can come from a stale process.
    for _ in range(4):
        assert session.get(f"{api}/api/v1/workflows", timeout=10).status_code == 200
    done = cli(database_url, "apikey", "revoke", str(key_id))
    assert done.returncode == 0, done.stderr
    for _ in range(4):
        r = session.get(f"{api}/api/v1/workflows", timeout=10)
        assert r.status_code == 401
        assert r.headers["Content-Type"] == PROBLEM
        assert "revoked" in r.json()["detail"]
    listing = cli(database_url, "apikey", "list").stdout
    assert "revoked" in next(line for line in listing.splitlines() if "leaving" in line)


def test_revoked_fixture_key_is_401_in_process(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    assert app_client.get("/api/v1/workflows", headers=bearer(api_key)).status_code == 200
    db.execute("UPDATE api_keys SET revoked_at = now()")
    assert_problem(app_client.get("/api/v1/workflows", headers=bearer(api_key)), 401)


def test_scoped_key_reaches_only_its_workflows(
    app_client: Any, database_url: str, db: psycopg.Connection, world: dict[str, str]
) -> None:
    key = create_with_cli(database_url, "--name", "only-a", "--workflow", "a")
    h = bearer(key)
    get = app_client.get
    # Workflow a: read and publish.
    assert get("/api/v1/workflows/a", headers=h).status_code == 200
    assert get("/api/v1/workflows/a/versions/1", headers=h).status_code == 200
    published = app_client.post("/api/v1/workflows/a/versions", json=OPEN, headers=h)
    assert published.status_code == 201
    assert published.get_json()["version"] == 2
    assert get(f"/api/v1/executions/{world['a']}", headers=h).status_code == 200
    assert app_client.post("/api/v1/workflows/a/webhook-secrets", headers=h).status_code == 201
    # Workflow b: nothing at all, not even its existence in listings.
    assert_problem(get("/api/v1/workflows/b", headers=h), 403)
    assert_problem(get("/api/v1/workflows/b/versions/1", headers=h), 403)
    assert_problem(app_client.post("/api/v1/workflows/b/versions", json=OPEN, headers=h), 403)
    assert_problem(get(f"/api/v1/executions/{world['b']}", headers=h), 403)
    assert_problem(app_client.post(f"/api/v1/executions/{world['b']}/cancel", headers=h), 403)
    assert_problem(app_client.post("/api/v1/workflows/b/webhook-secrets", headers=h), 403)
    assert_problem(get("/api/v1/workflows/b/webhook-secrets", headers=h), 403)
    assert_problem(get("/api/v1/executions?workflow=b", headers=h), 403)
    # A workflow that does not exist yet cannot be created through a scoped key either.
    assert_problem(app_client.post("/api/v1/workflows/c/versions", json=OPEN, headers=h), 403)
    listed = get("/api/v1/executions", headers=h).get_json()["items"]
    assert [item["id"] for item in listed] == [world["a"]]
    workflows = get("/api/v1/workflows", headers=h).get_json()["items"]
    assert [w["workflow"] for w in workflows] == ["a"]
    # b's execution was not touched by the refused cancel.
    status = db.execute("SELECT status FROM executions WHERE id = %s", (world["b"],)).fetchone()
    assert status == ("queued",)


def test_read_only_key_reads_but_never_writes(
    app_client: Any, database_url: str, db: psycopg.Connection, world: dict[str, str]
) -> None:
    key = create_with_cli(database_url, "--name", "viewer", "--read-only")
    h = bearer(key)
    eid = world["a"]
    assert app_client.get("/api/v1/workflows", headers=h).status_code == 200
    assert app_client.get("/api/v1/workflows/a", headers=h).status_code == 200
    assert app_client.get("/api/v1/workflows/a/webhook-secrets", headers=h).status_code == 200
    assert app_client.get(f"/api/v1/executions/{eid}", headers=h).status_code == 200
    assert len(app_client.get("/api/v1/executions", headers=h).get_json()["items"]) == 2
    events_before = db.execute("SELECT count(*) FROM execution_events").fetchone()[0]
    writes = [
        ("post", "/api/v1/workflows/a/versions", OPEN),
        ("post", "/api/v1/workflows/new/versions", OPEN),
        ("post", f"/api/v1/executions/{eid}/cancel", None),
        ("post", f"/api/v1/executions/{eid}/retry", None),
        ("post", f"/api/v1/executions/{eid}/steps/shape/resolve", {"outcome": "failed"}),
        ("post", "/api/v1/workflows/a/webhook-secrets", None),
        ("delete", "/api/v1/workflows/a/webhook-secrets/1", None),
    ]
    for method, path, body in writes:
        r = getattr(app_client, method)(path, json=body, headers=h)
        assert_problem(r, 403)
    assert db.execute("SELECT count(*) FROM webhook_secrets").fetchone()[0] == 0
    assert db.execute("SELECT latest_version FROM workflows WHERE key = 'a'").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM workflows WHERE key = 'new'").fetchone()[0] == 0
    status = db.execute("SELECT status FROM executions WHERE id = %s", (eid,)).fetchone()[0]
    assert status == "queued"
    assert db.execute("SELECT count(*) FROM execution_events").fetchone()[0] == events_before


def test_scoped_read_only_key_combines_both_limits(
    app_client: Any, db: psycopg.Connection, world: dict[str, str]
) -> None:
    _, key = apikeys.create(db, "a-viewer", ["a"], read_only=True)
    h = bearer(key)
    assert app_client.get(f"/api/v1/executions/{world['a']}", headers=h).status_code == 200
    assert_problem(app_client.post(f"/api/v1/executions/{world['a']}/cancel", headers=h), 403)
    assert_problem(app_client.get(f"/api/v1/executions/{world['b']}", headers=h), 403)


def test_last_used_at_is_recorded(
    app_client: Any, database_url: str, db: psycopg.Connection
) -> None:
    key = create_with_cli(database_url, "--name", "tracked")
    query = "SELECT last_used_at FROM api_keys WHERE name = 'tracked'"
    assert db.execute(query).fetchone()[0] is None
    assert "never" in next(
        line
        for line in cli(database_url, "apikey", "list").stdout.splitlines()
        if "tracked" in line
    )
    assert app_client.get("/api/v1/workflows", headers=bearer(key)).status_code == 200
    used = db.execute(query).fetchone()[0]
    assert used is not None
    (now,) = db.execute("SELECT now()").fetchone()
    assert abs((now - used).total_seconds()) < 60
    # A refused key does not touch anything.
    db.execute("UPDATE api_keys SET revoked_at = now(), last_used_at = NULL WHERE name = 'tracked'")
    app_client.get("/api/v1/workflows", headers=bearer(key))
    assert db.execute(query).fetchone()[0] is None
