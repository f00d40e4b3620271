"""Logs an operator can join: the API takes the trusted proxy's X-Request-Id (nginx's
$request_id) for its access line, its own lines and its answer, and makes its own for
anyone else; an accepted webhook's line names its execution; every PostgreSQL connection
says which program holds it."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import requests

from tests.support.api import Api
from tests.support.definitions import OPEN
from tests.support.processes import start_api


def _records(log: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.splitlines() if line.strip()]


def test_the_proxys_request_id_joins_its_lines_and_the_webhook_names_its_execution(
    env: dict[str, str], tmp_path: Path, api_key: str, db: psycopg.Connection
) -> None:
    process, base = start_api(env, tmp_path / "api.log", workers=1)
    try:
        Api(base, api_key).publish("open", OPEN)
        given = {"X-Request-Id": "0f3a9c2e8b7d4e1fa6b5c4d3e2f1a0b9"}
        r = requests.post(f"{base}/hooks/open", json={"x": 1}, headers=given, timeout=10)
        assert r.status_code == 202 and r.headers["X-Request-Id"] == given["X-Request-Id"]
        execution_id = r.json()["execution_id"]
        forged = requests.get(
            f"{base}/healthz", headers={"X-Request-Id": "two words\tand a tab"}, timeout=10
        )
        assert forged.headers["X-Request-Id"] != "two words\tand a tab"
        # While it serves, its pooled connection says who holds it.
        names = {
            name
            for (name,) in db.execute(
                "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
            )
        }
        assert "flowforge-api" in names, names
    finally:
        process.stop()
    records = _records(process.log())
    access = next(
        r
        for r in records
        if r.get("logger") == "gunicorn.access" and r.get("path") == "/hooks/open"
    )
    assert access["request_id"] == given["X-Request-Id"]
    accepted = next(r for r in records if r.get("msg") == "webhook accepted")
    assert accepted["request_id"] == given["X-Request-Id"]
    assert accepted["execution_id"] == execution_id and accepted["workflow"] == "open"


def test_an_untrusted_peers_request_id_is_not_taken(env: dict[str, str], tmp_path: Path) -> None:
    # Only 10.9.9.9 is a trusted proxy now: this loopback client is not.
    process, base = start_api({**env, "FORWARDED_ALLOW_IPS": "10.9.9.9"}, tmp_path / "api.log", 1)
    try:
        r = requests.get(f"{base}/healthz", headers={"X-Request-Id": "chosen-by-me"}, timeout=10)
        assert r.status_code == 200 and r.headers["X-Request-Id"] != "chosen-by-me"
    finally:
        process.stop()
