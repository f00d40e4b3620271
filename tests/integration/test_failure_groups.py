"""Failure groups in process (docs/contract.md#failure-groups): failed executions of one
step with one signature are one group, counted; a resolved group that recurs reopens and
alerts once (one notification event, one count of the metric); an ignored one counts on
silently; a group is retried and replayed whole; bad requests are refused whole."""

from __future__ import annotations

import json

import psycopg
from prometheus_client import REGISTRY

from tests.integration.test_console import _sign_in
from tests.integration.test_webhook_signatures import cli
from tests.support.definitions import unsigned
from tests.support.inprocess import InProcess

MARK = {"id": "mark", "type": "transform", "output": {"n": "{{ input.n }}"}}
BROKEN = {"id": "shape", "type": "transform", "depends_on": ["mark"], "output": "{{ mark.no.x }}"}
FIXED = {**BROKEN, "output": {"n": "{{ mark.n }}"}}
OPENED = "flowforge_failure_groups_opened_total"
ALERTS = "SELECT count(*) FROM notify_pending WHERE kind = 'failure_group.opened'"


def _fail(in_process: InProcess, first: int, n: int) -> list[str]:
    ids = [in_process.start("grouped", {"n": i}) for i in range(first, first + n)]
    for eid in ids:
        in_process.wait(eid, "failed")
    return ids


def _opened() -> float:
    return REGISTRY.get_sample_value(OPENED) or 0.0


def _group(in_process: InProcess) -> dict:
    groups = in_process.app.get("/api/v1/failure-groups?workflow=grouped").get_json()["groups"]
    assert len(groups) == 1, groups
    return dict(groups[0])


def test_a_group_counts_reopens_once_and_is_acted_on_whole(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    subscribed = in_process.post(
        "/api/v1/notifications",
        {"name": "ops", "url": "http://127.0.0.1:9/", "kinds": ["failure_group.opened"]},
    )
    assert subscribed.status_code == 201, subscribed.text
    in_process.publish("grouped", unsigned([MARK, BROKEN]))
    before = _opened()
    ids = _fail(in_process, 0, 3)
    group = _group(in_process)
    assert (group["step"], group["outcome"], group["count"], group["pending"]) == (
        "shape",
        "failed",
        3,
        3,
    )
    assert group["status"] == "open" and "<q>" in group["message"]
    assert db.execute(ALERTS).fetchone() == (1,) and _opened() == before + 1
    linked = db.execute(
        "SELECT count(*) FROM executions WHERE failure_group_id = %s", (group["id"],)
    ).fetchone()
    assert linked == (3,)
    shown = in_process.app.get(f"/api/v1/failure-groups/{group['id']}").get_json()
    assert {e["id"] for e in shown["executions"]} == set(ids)

    # Resolved, then the same failure again: reopened, one more alert for two failures.
    done = in_process.post(f"/api/v1/failure-groups/{group['id']}/resolve")
    assert done.status_code == 200 and done.json()["status"] == "resolved"
    _fail(in_process, 3, 2)
    group = _group(in_process)
    assert (group["status"], group["count"]) == ("open", 5)
    assert db.execute(ALERTS).fetchone() == (2,) and _opened() == before + 2

    # Ignored: a retry of all five fails them again, counted, and nobody is told.
    assert in_process.post(f"/api/v1/failure-groups/{group['id']}/ignore").status_code == 200
    retried = in_process.post(f"/api/v1/failure-groups/{group['id']}/retry", {"limit": 10})
    assert retried.status_code == 200, retried.text
    assert len(retried.json()["retried"]) == 5 and retried.json()["next_after"] is None
    for eid in retried.json()["retried"]:
        in_process.wait(eid, "failed")
    group = _group(in_process)
    assert (group["status"], group["count"]) == ("ignored", 10)
    assert db.execute(ALERTS).fetchone() == (2,) and _opened() == before + 2

    # Reopened by hand (no alert), then replayed whole onto the fix.
    assert (
        in_process.post(f"/api/v1/failure-groups/{group['id']}/reopen").json()["status"] == "open"
    )
    in_process.publish("grouped", unsigned([MARK, FIXED]))
    replayed = in_process.post(f"/api/v1/failure-groups/{group['id']}/replay", {"limit": 3})
    assert replayed.status_code == 200, replayed.text
    first = replayed.json()
    assert len(first["replayed"]) == 3 and first["next_after"] is not None
    rest = in_process.post(
        f"/api/v1/failure-groups/{group['id']}/replay", {"after": first["next_after"]}
    ).json()
    assert len(rest["replayed"]) == 2 and rest["next_after"] is None
    for eid in first["replayed"] + rest["replayed"]:
        in_process.wait(eid, "succeeded")
    # Each execution is replayed once: the group has none left to replay.
    again = in_process.post(f"/api/v1/failure-groups/{group['id']}/replay").json()
    assert again == {"replayed": [], "refused": [], "next_after": None}
    assert _group(in_process)["pending"] == 0
    assert db.execute(ALERTS).fetchone() == (2,)


def test_bad_requests_are_refused(in_process: InProcess) -> None:
    app = in_process.app
    assert app.get("/api/v1/failure-groups?status=gone").status_code == 400
    assert app.get("/api/v1/failure-groups?limit=0").status_code == 400
    assert app.get("/api/v1/failure-groups?workflow=%00").status_code == 400
    assert app.get("/api/v1/failure-groups/12345").status_code == 404
    assert app.get(f"/api/v1/failure-groups/{2**70}").status_code == 404
    assert app.post("/api/v1/failure-groups/1/resolve").status_code == 404
    bad = in_process.post("/api/v1/failure-groups/1/replay", {"limit": "x", "extra": 1})
    assert bad.status_code == 422
    assert bad.json()["errors"] == [{"path": "$.extra", "message": "unexpected field"}]
    assert in_process.post("/api/v1/failure-groups/1/retry", {"after": "no"}).status_code == 422


def test_the_failed_inbox_shows_groups_and_acts_behind_the_csrf_token(
    in_process: InProcess, api_key: str, db: psycopg.Connection, database_url: str
) -> None:
    in_process.publish("grouped", unsigned([MARK, BROKEN]))
    _fail(in_process, 0, 2)
    group_id = _group(in_process)["id"]
    app = in_process.app
    app.environ_base.pop("HTTP_AUTHORIZATION")
    csrf = _sign_in(app, api_key)
    page = app.get("/ui/failed").get_data(as_text=True)
    assert f'id="failure-group-{group_id}"' in page and 'class="failure-resolve"' in page
    forged = app.post(f"/ui/failed/groups/{group_id}", data={"action": "resolve"})
    assert forged.status_code == 403
    done = app.post(f"/ui/failed/groups/{group_id}", data={"action": "resolve", "csrf": csrf})
    assert done.status_code == 302, done.get_data(as_text=True)
    status = db.execute("SELECT status FROM failure_groups WHERE id = %s", (group_id,)).fetchone()
    assert status == ("resolved",)
    page = app.get("/ui/failed").get_data(as_text=True)
    assert 'class="failure-reopen"' in page and 'class="failure-resolve"' not in page
    bad = app.post(f"/ui/failed/groups/{group_id}", data={"action": "drop", "csrf": csrf})
    assert bad.status_code == 400

    # The same group from the CLI on the box (--db), as the history names it.
    assert "reopened" in cli(database_url, "--db", "failures", "reopen", str(group_id))
    listed = json.loads(cli(database_url, "--db", "failures", "groups", "--output", "json"))
    assert [(g["id"], g["status"], g["pending"]) for g in listed["groups"]] == [
        (group_id, "open", 2)
    ]
    by = db.execute("SELECT status_by->>'kind' FROM failure_groups").fetchone()
    assert by == ("cli",)
