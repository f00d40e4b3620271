"""`flowforge workflow pause|resume KEY` and `flowforge pause|resume ID` (docs/contract.md#pause):
remote through a real bin/api with the key named in the history, and on the box against the
database with `cli@<host>` as the actor."""

from __future__ import annotations

import json

import psycopg
import requests

from flowforge.store import apikeys
from tests.integration.test_api_keys import cli
from tests.integration.test_cli_remote import ok, refused, remote, start
from tests.support.definitions import OPEN

# Each event an actor caused in one execution's history: its kind and the actor's kind.
ACTORS = """
SELECT kind, detail->'actor'->>'kind' FROM execution_events
WHERE execution_id = %s AND detail ? 'actor' ORDER BY id
"""


def actors(db: psycopg.Connection, execution_id: str) -> list[tuple[str, str]]:
    return db.execute(ACTORS, (execution_id,)).fetchall()


def test_remote_and_on_the_box_pause_and_resume_name_their_actor(
    api: str, api_key: str, database_url: str, db: psycopg.Connection
) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    r = requests.post(
        f"{api}/api/v1/workflows/open/versions", json=OPEN, headers=headers, timeout=10
    )
    assert r.status_code == 201, r.text
    eid = start(api, "open")

    # A read-only key may not pause, nor replay.
    _, viewer = apikeys.create(db, "viewer", read_only=True)
    refused(remote(api, viewer, "workflow", "pause", "open"), 1, "error: Forbidden")
    refused(remote(api, viewer, "pause", eid), 1, "error: Forbidden")
    refused(remote(api, viewer, "replay", eid, "--from-step", "shape"), 1, "error: Forbidden")
    assert db.execute("SELECT paused_at FROM workflows").fetchone() == (None,)

    out = ok(remote(api, api_key, "workflow", "pause", "open"))
    assert "workflow open is paused (1 executions held)" in out
    assert db.execute("SELECT status FROM executions").fetchone() == ("paused",)
    # One execution of a paused workflow is not resumed on its own.
    refused(remote(api, api_key, "resume", eid), 1, "error: Conflict")
    done = json.loads(ok(remote(api, api_key, "workflow", "resume", "open", "--output", "json")))
    assert done["resumed"] == 1 and done["paused"] is False

    # On the box: the same commands, the database straight, cli@host as actor.
    start(api, "open")
    (later,) = db.execute(
        "SELECT id::text FROM executions WHERE status <> 'succeeded' ORDER BY created_at DESC"
    ).fetchone()
    assert "is now paused" in ok(cli(database_url, "pause", later))
    assert "is now" in ok(cli(database_url, "resume", later))
    assert actors(db, later) == [("execution.paused", "cli"), ("execution.resumed", "cli")]
    assert actors(db, eid) == [("execution.paused", "api_key"), ("execution.resumed", "api_key")]
    refused(cli(database_url, "fail-paused", later), 1, "error: Conflict")
