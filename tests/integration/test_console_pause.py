"""The console's pause and resume buttons (docs/contract.md#pause), in-process against a real
database: an execution's and a workflow's, behind the session's CSRF token, recorded with the
signed-in key as actor, the reason shown, and no button for a read-only key."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from flowforge.store import apikeys
from tests.integration.test_console import _sign_in
from tests.support.definitions import OPEN


@pytest.fixture
def csrf(published: Any, api_key: str) -> str:
    """The console signed in with the tests' key; its session's CSRF token."""
    return _sign_in(published, api_key)


def first_execution(db: psycopg.Connection) -> str:
    """The id of the oldest execution (the console's fixture made a few)."""
    (eid,) = db.execute("SELECT id FROM executions ORDER BY id LIMIT 1").fetchone()
    return str(eid)


def status_of(db: psycopg.Connection, eid: str) -> str:
    (status,) = db.execute("SELECT status FROM executions WHERE id = %s", (eid,)).fetchone()
    return str(status)


def test_an_execution_is_paused_and_resumed_from_its_page_with_the_actor(
    published: Any,
    csrf: str,
    db: psycopg.Connection,
) -> None:
    eid = first_execution(db)
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="pause"' in page and 'id="resume"' not in page
    assert published.post(f"/ui/executions/{eid}/pause").status_code == 403  # no token
    assert published.post(f"/ui/executions/{eid}/pause", data={"csrf": csrf}).status_code == 303
    assert status_of(db, eid) == "paused"
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="resume"' in page and 'id="pause"' not in page
    assert 'id="paused-why"' in page and "operator (was queued)" in page
    assert published.post(f"/ui/executions/{eid}/resume", data={"csrf": csrf}).status_code == 303
    # Its steps are pure (transforms): resume runs them in its own unit of work.
    assert status_of(db, eid) == "succeeded"
    by = "SELECT kind, detail->'actor'->>'name' FROM execution_events WHERE execution_id = %s"
    actors = db.execute(by + " AND detail ? 'actor' ORDER BY id", (eid,)).fetchall()
    assert actors == [("execution.paused", "tests"), ("execution.resumed", "tests")]


def test_a_workflow_is_paused_and_resumed_from_its_page(
    published: Any,
    csrf: str,
    db: psycopg.Connection,
) -> None:
    page = published.get("/ui/workflows/open").get_data(as_text=True)
    assert 'id="pause-workflow"' in page
    assert published.post("/ui/workflows/open/pause").status_code == 403  # no token
    assert published.post("/ui/workflows/open/pause", data={"csrf": csrf}).status_code == 303
    assert db.execute("SELECT paused_by->>'name' FROM workflows WHERE key = 'open'").fetchone() == (
        "tests",
    )
    statuses = db.execute("SELECT DISTINCT status FROM executions").fetchall()
    assert statuses == [("paused",)]
    page = published.get("/ui/workflows/open").get_data(as_text=True)
    assert 'id="resume-workflow"' in page and "paused</span> since" in page
    eid = first_execution(db)
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="workflow-paused-why"' in page
    assert published.post("/ui/workflows/open/resume", data={"csrf": csrf}).status_code == 303
    assert db.execute("SELECT paused_at FROM workflows WHERE key = 'open'").fetchone() == (None,)
    statuses = db.execute("SELECT DISTINCT status FROM executions").fetchall()
    assert statuses == [("succeeded",)]


def test_a_read_only_key_sees_no_pause_button_and_a_forged_post_is_refused(
    published: Any,
    db: psycopg.Connection,
) -> None:
    _, key = apikeys.create(db, "viewer", read_only=True)
    csrf = _sign_in(published, key)
    eid = first_execution(db)
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="pause"' not in page and 'id="resume"' not in page
    assert 'id="pause-workflow"' not in published.get("/ui/workflows/open").get_data(as_text=True)
    assert published.post(f"/ui/executions/{eid}/pause", data={"csrf": csrf}).status_code == 403
    assert published.post("/ui/workflows/open/pause", data={"csrf": csrf}).status_code == 403
    assert db.execute("SELECT count(*) FROM executions WHERE status = 'paused'").fetchone() == (0,)
    assert db.execute("SELECT paused_at FROM workflows WHERE key = 'open'").fetchone() == (None,)


def test_a_paused_workflow_is_resumed_onto_its_newest_version_from_its_page(
    published: Any,
    api_key: str,
    db: psycopg.Connection,
) -> None:
    csrf = _sign_in(published, api_key)
    assert published.post("/ui/workflows/open/pause", data={"csrf": csrf}).status_code == 303
    page = published.get("/ui/workflows/open").get_data(as_text=True)
    assert "Resume onto v1" in page  # shown while paused, naming the newest version
    fixed = published.post(
        "/api/v1/workflows/open/versions",
        json=OPEN,
        headers={"Authorization": f"Bearer {api_key}"},
    )
    assert fixed.status_code == 201, fixed.get_data(as_text=True)
    page = published.get("/ui/workflows/open").get_data(as_text=True)
    assert 'id="resume-workflow-onto"' in page and "Resume onto v2" in page
    resumed = published.post("/ui/workflows/open/resume", data={"csrf": csrf, "onto": "2"})
    assert resumed.status_code == 303
    moved = db.execute(
        "SELECT DISTINCT v.version, e.status FROM executions e "
        "JOIN workflow_versions v ON v.id = e.version_id"
    ).fetchall()
    assert moved == [(2, "succeeded")]
    actors = db.execute(
        "SELECT DISTINCT detail->'actor'->>'name' FROM execution_events "
        "WHERE kind = 'execution.repinned'"
    ).fetchall()
    assert actors == [("tests",)]
