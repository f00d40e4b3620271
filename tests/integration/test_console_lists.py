"""The console's list, timeline and schedule forms, in-process against a real database (the
worker's executor too, run by hand: `worker_in_process`):
the list tells each execution's trigger, age (the absolute time in its title), duration
and first error, and finds one by its id or a prefix; a delay step is drawn on the
timeline; a schedule is paused, resumed, triggered and backfilled (a dry run first)
behind the session's CSRF token, with the signed-in key in the ledger, and a read-only
key gets no button and a refused POST."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from flowforge.store import apikeys
from tests.integration.test_api_keys import cli
from tests.integration.test_console import _sign_in
from tests.support.definitions import unsigned
from tests.support.inprocess import Runner
from tests.support.target import Reply, Target

# A row of the executions list: its status cell first (on a phone too, docs/reference/console.md).
ROW = re.compile(r"<tr>\s*(<td class=\"status\">.*?)</tr>", re.DOTALL)
LISTED = re.compile(r'<td class="id"><a class="mono" href="/ui/executions/([0-9a-f-]{36})"')
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z")


def _rows(page: str) -> dict[str, str]:
    return {LISTED.search(row).group(1): row for row in ROW.findall(page)}


def test_the_list_tells_trigger_age_duration_and_error_and_finds_an_id_by_prefix(
    published: Any, api_key: str, db: psycopg.Connection, worker_in_process: Runner
) -> None:
    auth = {"Authorization": f"Bearer {api_key}"}
    broken = unsigned([{"id": "shape", "type": "transform", "output": "{{ input.a.b }}"}])
    r = published.post("/api/v1/workflows/broken/versions", json=broken, headers=auth)
    assert r.status_code == 201, r.get_data(as_text=True)
    assert published.post("/hooks/broken", json={"a": 1}).status_code == 202
    finished = "SELECT count(*) FROM executions WHERE finished_at IS NOT NULL"
    worker_in_process.until(lambda: db.execute(finished).fetchone() == (4,), 60, "four finished")
    (failed, error) = db.execute(
        "SELECT e.id::text, s.error FROM executions e JOIN steps s ON s.execution_id = e.id "
        "WHERE e.status = 'failed'"
    ).fetchone()
    assert error

    _sign_in(published, api_key)
    rows = _rows(published.get("/ui/executions").get_data(as_text=True))
    assert len(rows) == 4
    for row in rows.values():
        assert '<td class="trigger">webhook</td>' in row
        assert re.search(r'<time datetime="[^"]+" title="' + STAMP.pattern + '">', row)
        assert re.search(r">(just now|[\d.]+ (ms|s) ago)</time>", row)
        assert re.search(r'<td class="took" [^>]*>[\d.]+ (ms|s)</td>', row), row
    assert (
        error[:40] in rows[failed] and 'class="error-snippet"><span class="error"' in rows[failed]
    )
    others = [row for eid, row in rows.items() if eid != failed]
    assert all('<td class="error-snippet"></td>' in row for row in others)

    # By the full id: that one; by a prefix, dashes and case as pasted: every id it starts.
    page = published.get(f"/ui/executions?id={failed.upper()}").get_data(as_text=True)
    assert list(_rows(page)) == [failed]
    prefix = failed[:11]
    page = published.get(f"/ui/executions?id={prefix}").get_data(as_text=True)
    assert set(_rows(page)) == {eid for eid in rows if eid.startswith(prefix)}
    assert 'value="' + prefix + '"' in page  # the form keeps what was typed
    refused = published.get("/ui/executions?id=not-an-id")
    assert refused.status_code == 400 and "execution id" in refused.get_data(as_text=True)


def test_a_delay_is_drawn_on_the_timeline(
    published: Any, api_key: str, db: psycopg.Connection, worker_in_process: Runner
) -> None:
    auth = {"Authorization": f"Bearer {api_key}"}
    nap = unsigned([{"id": "nap", "type": "delay", "duration_s": 3600}])
    assert (
        published.post("/api/v1/workflows/nap/versions", json=nap, headers=auth).status_code == 201
    )
    assert published.post("/hooks/nap", json={}).status_code == 202
    napping = "SELECT execution_id::text FROM steps WHERE step_id = 'nap' AND status = 'waiting'"
    (eid,) = worker_in_process.until(
        lambda: db.execute(napping).fetchone(), 60, "the delay waiting"
    )
    _sign_in(published, api_key)
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    bar = re.search(
        r'<rect class="bar pause pause-delay" data-kind="delay"[^>]*><title>([^<]*)', page
    )
    assert bar, page
    assert bar.group(1).startswith("nap: delay, ") and ", wakes " in bar.group(1)
    assert STAMP.search(bar.group(1))


SWEEP = {
    "name": "Sweep",
    "trigger": {"schedule": {"every_s": 3600}},
    "steps": [{"id": "note", "type": "transform", "output": {"tick": "{{ input.tick_at }}"}}],
}


def _ledger(db: psycopg.Connection, *, operator: bool = False) -> list[tuple[str, str | None]]:
    """The sweep's ledger: its ticks, or (operator) its pause and resume rows."""
    rows = db.execute(
        "SELECT l.outcome, l.actor->>'name' FROM schedule_ticks l "
        "JOIN workflows w ON w.id = l.workflow_id WHERE w.key = 'sweep' ORDER BY l.tick_at"
    ).fetchall()
    return [r for r in rows if (r[0] in ("pause", "resume")) == operator]


def test_a_schedule_is_paused_resumed_triggered_and_backfilled_from_its_page(
    published: Any, api_key: str, db: psycopg.Connection
) -> None:
    auth = {"Authorization": f"Bearer {api_key}"}
    r = published.post("/api/v1/workflows/sweep/versions", json=SWEEP, headers=auth)
    assert r.status_code == 201, r.get_data(as_text=True)
    csrf = _sign_in(published, api_key)
    page = published.get("/ui/workflows/sweep").get_data(as_text=True)
    assert 'id="pause-schedule"' in page and 'id="trigger-schedule"' in page
    assert 'id="backfill-preview"' in page

    assert published.post("/ui/workflows/sweep/schedule/pause").status_code == 403  # no token
    r = published.post("/ui/workflows/sweep/schedule/pause", data={"csrf": csrf})
    assert r.status_code == 303 and r.headers["Location"].endswith("/ui/workflows/sweep#schedule")
    assert published.get("/api/v1/workflows/sweep/schedule", headers=auth).get_json()["paused"]
    page = published.get("/ui/workflows/sweep").get_data(as_text=True)
    assert 'id="resume-schedule"' in page
    assert re.search(r"paused</span> since " + STAMP.pattern, page)
    r = published.post("/ui/workflows/sweep/schedule/resume", data={"csrf": csrf})
    assert r.status_code == 303
    assert not published.get("/api/v1/workflows/sweep/schedule", headers=auth).get_json()["paused"]
    assert sorted(_ledger(db, operator=True)) == [("pause", "tests"), ("resume", "tests")]

    # Trigger now: on to the tick's execution, ledgered with the signed-in key.
    r = published.post("/ui/workflows/sweep/schedule/trigger", data={"csrf": csrf})
    assert r.status_code == 303 and "/ui/executions/" in r.headers["Location"]
    assert _ledger(db) == [("fired", "tests")]

    # Backfill: the dry run fires nothing and offers the confirmation; confirmed, it fires.
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    span = {
        "from": (now - timedelta(hours=3, minutes=30)).isoformat(),
        "to": (now - timedelta(minutes=1)).isoformat(),
    }
    r = published.post(
        "/ui/workflows/sweep/schedule/backfill", data={**span, "dry_run": "1", "csrf": csrf}
    )
    page = r.get_data(as_text=True)
    assert r.status_code == 200, page
    would = page.count('<td class="outcome">would fire</td>')
    assert would >= 3 and 'id="backfill-confirm"' in page
    assert _ledger(db) == [("fired", "tests")]
    r = published.post("/ui/workflows/sweep/schedule/backfill", data={**span, "csrf": csrf})
    page = r.get_data(as_text=True)
    assert page.count('<td class="outcome">fired</td>') == would, page
    assert len(_ledger(db)) == 1 + would
    assert 'id="backfill-confirm"' not in page

    # As the API's rules: a range that ends in the future, or before it starts, is refused.
    ahead = {"from": span["from"], "to": (now + timedelta(hours=1)).isoformat()}
    r = published.post("/ui/workflows/sweep/schedule/backfill", data={**ahead, "csrf": csrf})
    assert r.status_code == 422 and "future" in r.get_data(as_text=True)
    back = {"from": span["to"], "to": span["from"]}
    r = published.post("/ui/workflows/sweep/schedule/backfill", data={**back, "csrf": csrf})
    assert r.status_code == 400
    r = published.post(
        "/ui/workflows/sweep/schedule/backfill", data={"from": "soon", "to": "x", "csrf": csrf}
    )
    assert r.status_code == 400


def test_a_read_only_key_gets_no_schedule_button_and_its_post_is_refused(
    published: Any, api_key: str, db: psycopg.Connection
) -> None:
    auth = {"Authorization": f"Bearer {api_key}"}
    assert (
        published.post("/api/v1/workflows/sweep/versions", json=SWEEP, headers=auth).status_code
        == 201
    )
    _, key = apikeys.create(db, "viewer", read_only=True)
    csrf = _sign_in(published, key)
    page = published.get("/ui/workflows/sweep").get_data(as_text=True)
    assert 'id="schedule-state"' in page
    assert (
        "pause-schedule" not in page and "trigger-schedule" not in page and "backfill" not in page
    )
    assert (
        published.post("/ui/workflows/sweep/schedule/trigger", data={"csrf": csrf}).status_code
        == 403
    )
    assert _ledger(db) == []


def test_a_step_that_succeeded_on_a_later_try_shows_no_error_as_its_own(
    published: Any,
    api_key: str,
    database_url: str,
    db: psycopg.Connection,
    worker_in_process: Runner,
    target: Target,
) -> None:
    """The step keeps the error of the try before its success: the list's error column
    and `flowforge executions show` leave it out (the attempt lines still say it)."""
    answers = iter([Reply(status=503), Reply(status=201, json={"ticket": "T-1"})])
    target.script = lambda _r: next(answers)
    # With an idempotency key a POST may be sent again after a 503.
    request = {
        "method": "POST",
        "url": f"{target.url}/tickets",
        "json": {},
        "idempotency_key": "{{ execution.id }}",
    }
    retry = {"max_attempts": 2, "initial_interval_s": 0.1}
    step = {"id": "open", "type": "http_request", "request": request, "retry": retry}
    auth = {"Authorization": f"Bearer {api_key}"}
    r = published.post("/api/v1/workflows/ticket/versions", json=unsigned([step]), headers=auth)
    assert r.status_code == 201, r.get_data(as_text=True)
    eid = published.post("/hooks/ticket", json={}).get_json()["execution_id"]
    done = "SELECT status FROM executions WHERE id = %s AND finished_at IS NOT NULL"
    assert worker_in_process.until(lambda: db.execute(done, (eid,)).fetchone(), 60, "the end") == (
        "succeeded",
    )
    assert db.execute("SELECT error FROM steps WHERE execution_id = %s", (eid,)).fetchone()[0]

    _sign_in(published, api_key)
    row = _rows(published.get("/ui/executions?workflow=ticket").get_data(as_text=True))[eid]
    assert '<td class="error-snippet"></td>' in row
    shown = cli(database_url, "executions", "show", eid)
    assert shown.returncode == 0, shown.stderr
    step_line = next(line for line in shown.stdout.splitlines() if line.startswith("  open "))
    assert "succeeded" in step_line and "error" not in step_line
    assert "attempt 1: failed HTTP 503" in shown.stdout
