"""The console's failed inbox (docs/contract.md#failed-inbox): failed executions, failed by a real
bin/worker, grouped by step and error, oldest first, bulk-replayed onto the newest version behind
the session's CSRF token with the signed-in key as actor; no button for a read-only key."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable
from typing import Any

import psycopg

from flowforge.store import apikeys
from tests.integration.test_console import _sign_in
from tests.support.definitions import unsigned
from tests.support.processes import Process

MARK = {"id": "mark", "type": "transform", "output": {"n": "{{ input.n }}"}}
BROKEN = {"id": "shape", "type": "transform", "depends_on": ["mark"], "output": "{{ mark.no.x }}"}
FIXED = {**BROKEN, "output": {"n": "{{ mark.n }}"}}


def _publish(client: Any, definition: dict[str, Any]) -> None:
    r = client.post("/api/v1/workflows/inbox/versions", json=definition)
    assert r.status_code == 201, r.get_data(as_text=True)


def _three_failed(
    open_client: Any, db: psycopg.Connection, workers: Callable[..., Process]
) -> None:
    """Three executions of `inbox` v1 failed by a real worker; v2 is the fix."""
    _publish(open_client, unsigned([MARK, BROKEN]))
    for n in range(3):
        assert open_client.post("/hooks/inbox", json={"n": n}).status_code == 202
    workers()
    deadline = time.monotonic() + 60
    while db.execute("SELECT count(*) FROM executions WHERE status = 'failed'").fetchone() != (3,):
        assert time.monotonic() < deadline, "three failed executions"
        time.sleep(0.2)
    _publish(open_client, unsigned([MARK, FIXED]))


def test_the_bulk_page_replays_the_filtered_executions_from_a_step(
    open_client: Any, db: psycopg.Connection, workers: Callable[..., Process]
) -> None:
    _three_failed(open_client, db, workers)
    key = open_client.environ_base.pop("HTTP_AUTHORIZATION").removeprefix("Bearer ")
    csrf = _sign_in(open_client, key)
    assert 'id="bulk-replay"' in open_client.get("/ui/executions").get_data(as_text=True)
    page = open_client.get("/ui/bulk?action=replay&workflow=inbox&status=failed")
    text = page.get_data(as_text=True)
    assert '<b id="preview-count">3</b>' in text and 'id="replay-from-step"' in text
    upto = re.search(r'name="upto" value="([^"]+)"', text).group(1)
    form = {"csrf": csrf, "action": "replay", "upto": upto, "workflow": "inbox"}
    form.update({"status": "failed", "from_step": "shape", "version": "latest"})
    done = open_client.post("/ui/bulk", data=form).get_data(as_text=True)
    assert '<b id="done">3</b> replayed' in done
    replays = db.execute(
        "SELECT status, count(*) FROM executions WHERE replay_of IS NOT NULL GROUP BY 1"
    ).fetchall()
    assert replays == [("succeeded", 3)]


def test_the_failed_inbox_groups_and_bulk_replays_onto_the_newest_version(
    open_client: Any, db: psycopg.Connection, workers: Callable[..., Process]
) -> None:
    _three_failed(open_client, db, workers)
    key = open_client.environ_base.pop("HTTP_AUTHORIZATION").removeprefix("Bearer ")

    _, viewer = apikeys.create(db, "viewer", read_only=True)
    _sign_in(open_client, viewer)
    page = open_client.get("/ui/failed").get_data(as_text=True)
    assert 'class="failed-group"' in page and "failed-replay" not in page
    open_client.post(
        "/ui/signout", data={"csrf": re.search(r'name="csrf" value="([^"]+)"', page).group(1)}
    )

    csrf = _sign_in(open_client, key)
    page = open_client.get("/ui/failed").get_data(as_text=True)
    assert page.count('class="failed-group"') == 1
    assert "Replay onto v2 (3)" in page
    # The group's form, its values unescaped as a browser posts them.
    form = dict(
        (name, html.unescape(value))
        for name, value in re.findall(
            r'name="(\w+)" value="([^"]*)"', page.split("failed-replay")[0].rsplit("<form", 1)[1]
        )
    )
    assert form["action"] == "replay" and form["step"] == "shape"
    assert open_client.post("/ui/failed", data={**form, "csrf": "x"}).status_code == 403
    done = open_client.post("/ui/failed", data={**form, "csrf": csrf}).get_data(as_text=True)
    assert "replay: 3 done, 0 skipped." in done
    replays = db.execute(
        "SELECT r.status, count(*) FROM executions r WHERE r.replay_of IS NOT NULL GROUP BY 1"
    ).fetchall()
    assert replays == [("succeeded", 3)]
    actors = db.execute(
        "SELECT DISTINCT detail->'actor'->>'name' FROM execution_events "
        "WHERE kind = 'execution.replayed'"
    ).fetchall()
    assert actors == [("tests",)]
    assert 'id="nothing-failed"' in open_client.get("/ui/failed").get_data(as_text=True)
    # Both ways on the execution pages, and one more replay from an execution's own page.
    original, made = db.execute(
        "SELECT replay_of::text, id::text FROM executions WHERE replay_of IS NOT NULL LIMIT 1"
    ).fetchone()
    page = open_client.get(f"/ui/executions/{original}").get_data(as_text=True)
    assert 'id="replayed-by"' in page and made in page and 'id="replay"' in page
    assert 'id="replay-of"' in open_client.get(f"/ui/executions/{made}").get_data(as_text=True)
    r = open_client.post(
        f"/ui/executions/{original}/replay",
        data={"csrf": csrf, "from_step": "mark", "version": "2"},
    )
    assert r.status_code == 303
    again = r.headers["Location"].rsplit("/", 1)[1]
    assert db.execute(
        "SELECT status, replay_from FROM executions WHERE id = %s", (again,)
    ).fetchone() == (
        "succeeded",
        "mark",
    )
