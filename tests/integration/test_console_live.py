"""Live progress in the console (docs/contract.md#live-progress), in-process against a real
database: the change poll answers at once when the page is behind, waits and ends on the
change, answers at once with Retry-After when every wait slot is taken, and the list
counts what changed since it was loaded. (tests/e2e/test_console.py watches a page update
itself in Chromium.)"""

from __future__ import annotations

import contextlib
import fcntl
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from flowforge.api.console import live
from flowforge.store import apikeys
from tests.integration.test_console import _sign_in

VERSION = re.compile(r'data-version="([0-9.-]+)"')


def _queued(db: psycopg.Connection) -> str:
    (eid,) = db.execute(
        "SELECT id::text FROM executions WHERE status = 'queued' ORDER BY id LIMIT 1"
    ).fetchone()
    return str(eid)


def _slot_taken(slots: live.Slots) -> bool:
    """Whether someone holds the first slot (a waiting poll takes the first free one)."""
    with open(slots.directory / "slot-0", "ab") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False  # closing the file lets it go


def test_the_change_poll_answers_waits_ends_on_the_change_and_is_bounded(
    published: Any, api_key: str, db: psycopg.Connection
) -> None:
    _sign_in(published, api_key)
    eid = _queued(db)
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    (version,) = VERSION.findall(page)
    changes = f"/ui/executions/{eid}/changes"

    # Behind (no version, or another one): at once.
    first = published.get(changes)
    assert first.status_code == 200 and first.get_json()["changed"] is True
    assert first.get_json()["version"] == version and first.get_json()["live"] is True
    assert published.get(f"{changes}?since=1.2&wait=5").get_json()["changed"] is True
    assert published.get(f"{changes}?since=x").status_code == 400
    assert published.get(f"{changes}?since={version}&wait=9").status_code == 400
    unchanged = published.get(f"{changes}?since={version}&wait=0")
    assert unchanged.get_json()["changed"] is False and "Retry-After" not in unchanged.headers

    # Every slot taken (FLOWFORGE_LIVE_WAITS, 2 by default): at once, with Retry-After.
    with published.application.app_context():
        slots = live.wait_slots()
    assert slots.size == 2
    with contextlib.ExitStack() as held:
        assert all(held.enter_context(slots.taken()) for _ in range(slots.size))
        refused = published.get(f"{changes}?since={version}&wait=5")
    assert refused.get_json()["changed"] is False
    assert refused.headers["Retry-After"] == str(live.RETRY_AFTER_S)

    # A slot free: the poll waits, and ends when the execution changes.
    answers: list[Any] = []
    waiter = threading.Thread(
        target=lambda: answers.append(published.get(f"{changes}?since={version}&wait=5"))
    )
    waiter.start()
    deadline = time.monotonic() + 5
    while not _slot_taken(slots) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _slot_taken(slots), "the poll never started waiting"
    auth = {"Authorization": f"Bearer {api_key}"}
    assert published.post(f"/api/v1/executions/{eid}/cancel", headers=auth).status_code == 202
    waiter.join(15)
    (answer,) = answers
    body = answer.get_json()
    assert body["changed"] is True and body["version"] != version
    assert body["status"] == "cancelled" and body["live"] is False, body
    assert not _slot_taken(slots)
    # Over: answered at once, even at its own version, and the page stops watching.
    over = published.get(f"{changes}?since={body['version']}&wait=5").get_json()
    assert over["changed"] is False and over["live"] is False
    fragment = published.get(f"/ui/executions/{eid}/live")
    assert fragment.headers["X-Live"] == "0" and fragment.headers["X-Version"] == body["version"]
    assert (
        published.get("/ui/executions/0190a8c4-0000-7000-8000-000000000000/changes").status_code
        == 404
    )


def test_the_list_counts_what_changed_since_it_was_loaded_within_the_keys_scope(
    published: Any, api_key: str, db: psycopg.Connection
) -> None:
    _sign_in(published, api_key)
    page = published.get("/ui/executions").get_data(as_text=True)
    assert 'id="changed" hidden' in page and "since=" in page
    before = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    now = published.get("/ui/executions/changed", query_string={"since": before}).get_json()
    # The three queued executions were created a moment ago.
    assert now == {"changed": 3, "capped": False}
    later = datetime.now(UTC).isoformat()
    assert published.get("/ui/executions/changed", query_string={"since": later}).get_json() == {
        "changed": 0,
        "capped": False,
    }
    auth = {"Authorization": f"Bearer {api_key}"}
    eid = _queued(db)
    assert published.post(f"/api/v1/executions/{eid}/cancel", headers=auth).status_code == 202
    counted = published.get(
        "/ui/executions/changed", query_string={"since": later, "workflow": "open"}
    ).get_json()
    assert counted == {"changed": 1, "capped": False}
    narrowed = published.get(
        "/ui/executions/changed", query_string={"since": later, "status": "queued"}
    ).get_json()
    assert narrowed["changed"] == 0
    assert published.get("/ui/executions/changed?since=soon").status_code == 400

    # The live routes are a viewer's, within the key's scope.
    eid = _queued(db)
    since = datetime.now(UTC).isoformat()
    _, viewer = apikeys.create(db, "viewer", read_only=True)
    _sign_in(published, viewer)
    assert published.get(f"/ui/executions/{eid}/changes?wait=0").status_code == 200
    assert published.get("/ui/executions/changed", query_string={"since": since}).status_code == 200
    _, elsewhere = apikeys.create(db, "other only", workflows=["other"])
    _sign_in(published, elsewhere)
    assert published.get(f"/ui/executions/{eid}/changes?wait=0").status_code == 403
    scoped = {"since": since, "workflow": "open"}
    assert published.get("/ui/executions/changed", query_string=scoped).status_code == 403
    # Its own scope only: the three executions of `open` are not counted.
    before = "2000-01-01T00:00:00+00:00"
    mine = published.get("/ui/executions/changed", query_string={"since": before}).get_json()
    assert mine == {"changed": 0, "capped": False}
