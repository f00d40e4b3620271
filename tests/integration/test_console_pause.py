"""The console's pause and resume buttons (docs/contract.md#pause), in-process against a real
database: an execution's and a workflow's, behind the session's CSRF token, recorded with the
signed-in key as actor, the reason shown, and no button for a read-only key."""

from __future__ import annotations

from typing import Any

import psycopg

from flowforge.store import apikeys
from tests.integration.test_console import CSRF, _sign_in, published  # noqa: F401


def test_an_execution_is_paused_and_resumed_from_its_page_with_the_actor(
    published: Any,  # noqa: F811
    api_key: str,
    db: psycopg.Connection,
) -> None:
    csrf = _sign_in(published, api_key)
    (eid,) = db.execute("SELECT id FROM executions ORDER BY id LIMIT 1").fetchone()
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="pause"' in page and 'id="resume"' not in page
    assert published.post(f"/ui/executions/{eid}/pause").status_code == 403  # no token
    assert published.post(f"/ui/executions/{eid}/pause", data={"csrf": csrf}).status_code == 303
    assert db.execute("SELECT status FROM executions WHERE id = %s", (eid,)).fetchone() == (
        "paused",
    )
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="resume"' in page and 'id="pause"' not in page
    assert 'id="paused-why"' in page and "operator (was queued)" in page
    assert published.post(f"/ui/executions/{eid}/resume", data={"csrf": csrf}).status_code == 303
    # Its steps are pure (transforms): resume runs them in its own unit of work.
    assert db.execute("SELECT status FROM executions WHERE id = %s", (eid,)).fetchone() == (
        "succeeded",
    )
    actors = db.execute(
        "SELECT kind, detail->'actor'->>'name' FROM execution_events "
        "WHERE execution_id = %s AND detail ? 'actor' ORDER BY id",
        (eid,),
    ).fetchall()
    assert actors == [("execution.paused", "tests"), ("execution.resumed", "tests")]


def test_a_workflow_is_paused_and_resumed_from_its_page(
    published: Any,  # noqa: F811
    api_key: str,
    db: psycopg.Connection,
) -> None:
    csrf = _sign_in(published, api_key)
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
    (eid,) = db.execute("SELECT id FROM executions ORDER BY id LIMIT 1").fetchone()
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="workflow-paused-why"' in page
    assert published.post("/ui/workflows/open/resume", data={"csrf": csrf}).status_code == 303
    assert db.execute("SELECT paused_at FROM workflows WHERE key = 'open'").fetchone() == (None,)
    statuses = db.execute("SELECT DISTINCT status FROM executions").fetchall()
    assert statuses == [("succeeded",)]


def test_a_read_only_key_sees_no_pause_button_and_a_forged_post_is_refused(
    published: Any,  # noqa: F811
    db: psycopg.Connection,
) -> None:
    _, key = apikeys.create(db, "viewer", read_only=True)
    csrf = _sign_in(published, key)
    (eid,) = db.execute("SELECT id FROM executions ORDER BY id LIMIT 1").fetchone()
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="pause"' not in page and 'id="resume"' not in page
    assert 'id="pause-workflow"' not in published.get("/ui/workflows/open").get_data(as_text=True)
    assert published.post(f"/ui/executions/{eid}/pause", data={"csrf": csrf}).status_code == 403
    assert published.post("/ui/workflows/open/pause", data={"csrf": csrf}).status_code == 403
    assert db.execute("SELECT count(*) FROM executions WHERE status = 'paused'").fetchone() == (0,)
    assert db.execute("SELECT paused_at FROM workflows WHERE key = 'open'").fetchone() == (None,)
