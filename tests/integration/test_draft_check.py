"""The dry-run publish, POST /api/v1/workflows/{key}/check (flowforge/api/drafts.py): the
publish checker's answer with each error's path, a diff against the newest version and the
steps of a valid draft, and nothing written either way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
ORDER_SYNC = json.loads((ROOT / "docs" / "examples" / "order-sync.json").read_text())


def _counts(db: psycopg.Connection) -> tuple[int, int]:
    row = db.execute(
        "SELECT (SELECT count(*) FROM workflows), (SELECT count(*) FROM workflow_versions)"
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_an_invalid_draft_gets_the_publish_checkers_errors_and_nothing_is_written(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    draft = json.loads(json.dumps(ORDER_SYNC))
    draft["steps"][1]["depends_on"] = ["nowhere"]
    r = app_client.post("/api/v1/workflows/sync/check", json=draft)
    assert r.status_code == 422
    assert r.headers["Content-Type"].startswith("application/problem+json")
    paths = [e["path"] for e in r.get_json()["errors"]]
    assert any(p.startswith("$.steps[1].depends_on") for p in paths), paths
    assert _counts(db) == (0, 0)


def test_a_valid_draft_gets_its_diff_and_steps_and_nothing_is_published(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    new = app_client.post("/api/v1/workflows/sync/check", json=ORDER_SYNC)
    assert new.status_code == 200, new.get_json()
    assert new.get_json()["newest_version"] is None and new.get_json()["changes"] == []
    assert _counts(db) == (0, 0)
    assert app_client.post("/api/v1/workflows/sync/versions", json=ORDER_SYNC).status_code == 201
    draft = json.loads(json.dumps(ORDER_SYNC))
    draft["steps"][1]["duration_s"] = 1
    r = app_client.post("/api/v1/workflows/sync/check", json=draft)
    assert r.status_code == 200
    body = r.get_json()
    assert body["newest_version"] == 1 and body["valid"] is True
    assert body["changes"] == [["~", "$.steps[id=cool_off].duration_s", "2 → 1"]]
    assert body["steps"][1] == {"id": "cool_off", "type": "delay", "depends_on": ["lookup"]}
    assert _counts(db) == (1, 1)
