"""The console's security properties and filters, in-process against a real database:
sign-in cookies, CSRF on every POST, scoped and read-only keys, revoked keys, bounded
counts and every filter of the list. (tests/e2e/test_console.py drives it in Chromium.)"""

from __future__ import annotations

import re
import secrets
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from flowforge.api.console import graph
from flowforge.store import apikeys, search
from flowforge.worker.broker import Wakeup
from tests.support import inprocess
from tests.support.definitions import OPEN, unsigned
from tests.support.target import Reply, Target

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def _sign_in(client: Any, key: str) -> str:
    """Sign in through the form; returns the session's CSRF token."""
    page = client.get("/ui/signin")
    token = CSRF.search(page.get_data(as_text=True)).group(1)
    r = client.post("/ui/signin", data={"csrf": token, "api_key": key})
    assert r.status_code == 303, r.get_data(as_text=True)
    listing = client.get("/ui/executions")
    assert listing.status_code == 200
    return CSRF.search(listing.get_data(as_text=True)).group(1)


def test_sign_in_sets_a_hardened_cookie_and_sign_out_ends_the_session(
    published: Any, api_key: str, db: psycopg.Connection
) -> None:
    assert published.get("/ui/executions").headers["Location"].startswith("/ui/signin")
    page = published.get("/ui/signin")
    assert "HttpOnly" in page.headers["Set-Cookie"]
    # Without the sign-in form's own token the key is not even looked at.
    assert published.post("/ui/signin", data={"api_key": api_key}).status_code == 403
    token = CSRF.search(page.get_data(as_text=True)).group(1)
    assert published.post("/ui/signin", data={"csrf": token, "api_key": "ff_x"}).status_code == 401
    r = published.post(
        "/ui/signin", data={"csrf": token, "api_key": api_key, "next": "//evil.example/"}
    )
    assert r.status_code == 303 and r.headers["Location"] == "/ui/executions"
    cookie = next(c for c in r.headers.getlist("Set-Cookie") if c.startswith("ff_console="))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui/" in cookie
    assert "Secure" not in cookie  # plain HTTP here; over TLS see the next test
    # Only a hash of the cookie's token is stored.
    value = cookie.split(";")[0].split("=", 1)[1]
    stored = db.execute("SELECT token_hash FROM console_sessions").fetchall()
    assert len(stored) == 1 and value.encode() not in stored[0][0]
    listing = published.get("/ui/executions")
    assert listing.status_code == 200
    assert listing.headers["Content-Security-Policy"].startswith("default-src 'none'")
    csrf = CSRF.search(listing.get_data(as_text=True)).group(1)
    assert published.post("/ui/signout").status_code == 403  # no CSRF token
    assert published.post("/ui/signout", data={"csrf": csrf}).status_code == 303
    assert db.execute("SELECT count(*) FROM console_sessions").fetchone() == (0,)
    assert published.get("/ui/executions").status_code == 303


def test_the_cookie_is_secure_when_the_request_came_over_tls(published: Any, api_key: str) -> None:
    page = published.get("/ui/signin", base_url="https://console.example")
    token = CSRF.search(page.get_data(as_text=True)).group(1)
    r = published.post(
        "/ui/signin",
        data={"csrf": token, "api_key": api_key},
        base_url="https://console.example",
    )
    cookie = next(c for c in r.headers.getlist("Set-Cookie") if c.startswith("ff_console="))
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_a_revoked_key_ends_its_sessions(
    published: Any, api_key: str, db: psycopg.Connection
) -> None:
    _sign_in(published, api_key)
    (key_id,) = db.execute("SELECT api_key_id FROM console_sessions").fetchone()
    apikeys.revoke(db, key_id)
    assert published.get("/ui/executions").status_code == 303


def test_every_post_needs_the_sessions_csrf_token(
    published: Any, api_key: str, db: psycopg.Connection
) -> None:
    csrf = _sign_in(published, api_key)
    (eid,) = db.execute("SELECT id FROM executions ORDER BY id LIMIT 1").fetchone()
    for path in (
        f"/ui/executions/{eid}/cancel",
        f"/ui/executions/{eid}/retry",
        f"/ui/executions/{eid}/steps/shape/resolve",
        f"/ui/executions/{eid}/steps/shape/complete",
        f"/ui/executions/{eid}/steps/shape/fail",
        "/ui/bulk",
    ):
        assert published.post(path).status_code == 403, path
        assert published.post(path, data={"csrf": "x" + csrf}).status_code == 403, path
    assert db.execute("SELECT count(*) FROM executions WHERE status = 'cancelled'").fetchone() == (
        0,
    )
    r = published.post(f"/ui/executions/{eid}/cancel", data={"csrf": csrf})
    assert r.status_code == 303
    assert db.execute("SELECT status FROM executions WHERE id = %s", (eid,)).fetchone() == (
        "cancelled",
    )
    # Recorded with the signed-in key as the actor.
    actors = db.execute(
        "SELECT detail->'actor'->>'name' FROM execution_events "
        "WHERE execution_id = %s AND detail ? 'actor'",
        (eid,),
    ).fetchall()
    assert actors and {name for (name,) in actors} == {"tests"}


def test_a_read_only_key_sees_no_action_and_a_forged_post_is_refused(
    published: Any, db: psycopg.Connection
) -> None:
    _, key = apikeys.create(db, "viewer", read_only=True)
    csrf = _sign_in(published, key)
    (eid,) = db.execute("SELECT id FROM executions ORDER BY id LIMIT 1").fetchone()
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="dag"' in page and 'id="events"' in page
    assert "Cancel execution" not in page and 'id="cancel"' not in page
    assert "bulk-cancel" not in published.get("/ui/executions").get_data(as_text=True)
    r = published.post(f"/ui/executions/{eid}/cancel", data={"csrf": csrf})
    assert r.status_code == 403
    r = published.post("/ui/bulk", data={"csrf": csrf, "action": "cancel", "upto": str(eid)})
    assert r.status_code == 403
    assert published.get("/ui/bulk?action=cancel").status_code == 403
    assert db.execute("SELECT count(*) FROM executions WHERE status = 'cancelled'").fetchone() == (
        0,
    )


def test_a_scoped_key_sees_only_its_workflows(
    published: Any, api_key: str, db: psycopg.Connection
) -> None:
    published.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    assert published.post("/api/v1/workflows/other/versions", json=OPEN).status_code == 201
    assert published.post("/hooks/other", json={"x": "o"}).status_code == 202
    published.environ_base.pop("HTTP_AUTHORIZATION")
    _, key = apikeys.create(db, "other only", workflows=["other"])
    _sign_in(published, key)
    page = published.get("/ui/executions").get_data(as_text=True)
    assert page.count('href="/ui/executions/') == 1
    assert published.get("/ui/executions?workflow=open").status_code == 403
    (eid,) = db.execute(
        "SELECT e.id FROM executions e JOIN workflows w ON w.id = e.workflow_id "
        "WHERE w.key = 'open' LIMIT 1"
    ).fetchone()
    assert published.get(f"/ui/executions/{eid}").status_code == 403
    assert published.get("/ui/workflows/open").status_code == 403
    assert "open" not in published.get("/ui/workflows").get_data(as_text=True).split("<main>")[1]


def _ids(page: str) -> list[str]:
    return re.findall(r'href="/ui/executions/([0-9a-f-]{36})"', page)


def test_the_filters_narrow_the_list_and_the_counts(
    published: Any, api_key: str, db: psycopg.Connection
) -> None:
    _sign_in(published, api_key)
    all_ids = _ids(published.get("/ui/executions").get_data(as_text=True))
    assert len(all_ids) == 3 and all_ids == sorted(all_ids, reverse=True)
    page = published.get("/ui/executions?path=customer.id&value=7").get_data(as_text=True)
    (only,) = _ids(page)
    assert db.execute("SELECT input->>'x' FROM executions WHERE id = %s", (only,)).fetchone() == (
        "a",
    )
    assert _ids(published.get('/ui/executions?path=x&value="b"').get_data(as_text=True))
    assert not _ids(published.get("/ui/executions?path=customer.id&value=9").get_data(as_text=True))
    db.execute("UPDATE executions SET idempotency_key = 'k-1' WHERE id = %s", (only,))
    assert _ids(published.get("/ui/executions?idempotency_key=k-1").get_data(as_text=True)) == [
        only
    ]
    now = datetime.now(UTC)
    later = (now + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
    earlier = (now - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
    assert len(_ids(published.get(f"/ui/executions?from={earlier}").get_data(as_text=True))) == 3
    assert not _ids(published.get(f"/ui/executions?from={later}").get_data(as_text=True))
    assert not _ids(published.get(f"/ui/executions?to={earlier}").get_data(as_text=True))
    status = db.execute("SELECT status FROM executions WHERE id = %s", (only,)).fetchone()[0]
    listed = published.get(f"/ui/executions?status={status}&workflow=open").get_data(as_text=True)
    assert only in _ids(listed)
    for bad in ("status=nope", "workflow=Bad!", "from=yesterday", "path=a..b&value=1", "value=3"):
        assert published.get(f"/ui/executions?{bad}").status_code == 400, bad


def test_paging_is_keyset_and_counts_stop_at_the_cap(
    published: Any, api_key: str, db: psycopg.Connection
) -> None:
    db.execute(
        """
        INSERT INTO executions (id, workflow_id, version_id, status, input)
        SELECT (lpad(to_hex(1000000 + i), 12, '0') || '7000800000000000'
                || lpad(to_hex(i), 4, '0'))::uuid,
               w.id, v.id, 'failed', '{}'
        FROM generate_series(1, 60) i, workflows w JOIN workflow_versions v ON v.workflow_id = w.id
        """
    )
    _sign_in(published, api_key)
    first = published.get("/ui/executions?status=failed").get_data(as_text=True)
    ids = _ids(first)
    assert len(ids) == 50
    cursor = re.search(r'id="next-page" href="\?([^"]+)"', first).group(1).replace("&amp;", "&")
    second = _ids(published.get(f"/ui/executions?{cursor}").get_data(as_text=True))
    assert len(second) == 10 and not set(ids) & set(second) and max(second) < min(ids)
    flt = search.Filter(statuses=("failed",))
    assert search.status_counts(db, flt)["failed"] == "60"
    assert search._counts(db, flt, ("failed",), 25) == {"failed": (25, True)}
    assert search.uuid_floor(datetime(1970, 1, 1, tzinfo=UTC)) == str(uuid.UUID(int=0))


def _hidden(page: str) -> dict[str, str]:
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page))


def test_bulk_cancel_goes_in_batches_and_leaves_later_arrivals_alone(
    published: Any, api_key: str, db: psycopg.Connection
) -> None:
    published.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    for n in range(130):
        assert published.post("/hooks/open", json={"x": str(n)}).status_code == 202
    published.environ_base.pop("HTTP_AUTHORIZATION")
    csrf = _sign_in(published, api_key)
    preview = published.get("/ui/bulk?action=cancel&workflow=open")
    assert preview.status_code == 200
    page = preview.get_data(as_text=True)
    assert re.search(r'id="preview-count">(\d+)<', page).group(1) == "133"
    form = _hidden(page)
    assert form["csrf"] == csrf and form["workflow"] == "open"
    # Arrives after the preview: not part of what was confirmed.
    published.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    late = published.post("/hooks/open", json={"x": "late"}).get_json()["execution_id"]
    published.environ_base.pop("HTTP_AUTHORIZATION")

    first = published.post("/ui/bulk", data=form).get_data(as_text=True)
    assert re.search(r'id="done">(\d+)<', first).group(1) == "100"
    assert 'data-autosubmit="1"' in first
    second = published.post("/ui/bulk", data=_hidden(first)).get_data(as_text=True)
    assert re.search(r'id="done">(\d+)<', second).group(1) == "133"
    assert 'id="finished"' in second
    statuses = dict(
        db.execute(
            "SELECT status, count(*) FROM executions WHERE id <> %s GROUP BY status", (late,)
        ).fetchall()
    )
    assert statuses == {"cancelled": 133}
    assert db.execute("SELECT status FROM executions WHERE id = %s", (late,)).fetchone() == (
        "queued",
    )
    (recorded,) = db.execute(
        "SELECT count(DISTINCT execution_id) FROM execution_events "
        "WHERE detail->'actor'->>'name' = 'tests'"
    ).fetchone()
    assert recorded == 133


def test_the_pages_show_what_each_attempt_sent_and_got_back(
    app_client: Any,
    api_key: str,
    database_url: str,
    target: Target,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real executor (in-process) runs a GET that answers and a POST whose answer never
    comes: the execution page shows each attempt's request and response as recorded,
    redacted; the attention page what the unknown one sent, when and by whom."""
    value = "Tok" + secrets.token_hex(12)
    monkeypatch.setenv("FLOWFORGE_SECRET_TOK", value)
    target.script = lambda r: (
        Reply(json={"id": "q_1", "echo": r.headers["x-api-token"]})
        if r.path == "/quote"
        else Reply(json={}, delay_s=0.6)
    )
    token = {"X-Api-Token": "{{ secrets.tok }}"}
    definition = unsigned(
        [
            {
                "id": "quote",
                "type": "http_request",
                "request": {"method": "GET", "url": f"{target.url}/quote", "headers": token},
            },
            {
                "id": "charge",
                "type": "http_request",
                "depends_on": ["quote"],
                "request": {
                    "method": "POST",
                    "url": f"{target.url}/charge",
                    "headers": token,
                    "json": {"quote": "{{ quote.body.id }}"},
                    "timeout_s": 0.3,
                },
            },
        ]
    )
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    assert app_client.post("/api/v1/workflows/pay/versions", json=definition).status_code == 201
    eid = app_client.post("/hooks/pay", json={}).get_json()["execution_id"]
    app_client.environ_base.pop("HTTP_AUTHORIZATION")
    bindings = {"TOK": frozenset({"pay"})}
    with inprocess.executor(database_url, "test-console", secret_bindings=bindings) as executor:
        executor.handle(Wakeup(eid, "quote"))
        executor.handle(Wakeup(eid, "charge"))
    assert [r.headers["x-api-token"] for r in target.received] == [value, value]

    _sign_in(app_client, api_key)
    page = app_client.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="exchange-quote-1"' in page and 'id="exchange-charge-1"' in page
    assert f"<b>GET</b> {target.url}/quote" in page
    assert "X-Api-Token: [redacted]" in page
    assert "HTTP <b>200</b>" in page and "q_1" in page
    assert f"<b>POST</b> {target.url}/charge" in page
    assert 'by worker <span class="mono">worker-console</span>, no answer.' in page
    assert value not in page

    attention = app_client.get("/ui/attention").get_data(as_text=True)
    section = attention.split(f'id="unknown-{eid}-charge"')[1]
    assert "What was sent (redacted)" in section
    assert f"<b>POST</b> {target.url}/charge" in section and "q_1" in section
    assert "X-Api-Token: [redacted]" in section and "no answer." in section
    assert value not in attention


def test_the_workflow_page_shows_its_schedule_next_ticks_and_ledger(
    published: Any, api_key: str
) -> None:
    _sign_in(published, api_key)
    assert 'id="schedule-ledger"' not in published.get("/ui/workflows/open").get_data(as_text=True)
    scheduled = {**OPEN, "trigger": {"webhook": {"auth": "none"}, "schedule": {"every_s": 3600}}}
    published.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    assert published.post("/api/v1/workflows/open/versions", json=scheduled).status_code == 201
    fired = published.post("/api/v1/workflows/open/schedule/trigger")
    assert fired.status_code == 201, fired.get_data(as_text=True)
    assert published.post("/api/v1/workflows/open/schedule/pause").status_code == 200
    shown = published.get("/api/v1/workflows/open/schedule").get_json()
    published.environ_base.pop("HTTP_AUTHORIZATION")
    (execution_id,) = {r["execution_id"] for r in shown["ledger"] if r["outcome"] == "fired"}

    page = published.get("/ui/workflows/open").get_data(as_text=True)
    assert 'id="schedule-ledger"' in page and "every 3600 s in UTC" in page
    assert "paused" in page.split('id="schedule-state"')[1].split("</p>")[0]
    assert f'href="/ui/executions/{execution_id}"' in page
    # In the console's one format, as every other time on its pages.
    assert graph.stamp(shown["next"][0]["tick_at"]) in page
    assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:00:00\.000Z</td>", page)


@pytest.mark.parametrize("value", ["{}", "[]", '{"a": {}}', "[1, []]", '{"a": [{}]}'])
def test_a_filter_the_index_cannot_serve_is_refused_not_run(
    published: Any, api_key: str, value: str
) -> None:
    _sign_in(published, api_key)
    for page in ("/ui/executions", "/ui/bulk?action=cancel&"):
        glue = "?" if page.endswith("executions") else ""
        r = published.get(f"{page}{glue}path=customer&value={value}")
        assert r.status_code == 400, r.get_data(as_text=True)
        assert "empty object or list" in r.get_data(as_text=True)
    ok = published.get('/ui/executions?path=customer&value={"id": 7}')
    assert ok.status_code == 200 and len(_ids(ok.get_data(as_text=True))) == 1


def test_a_list_query_that_takes_too_long_is_cut_off_with_a_page_saying_so(
    published: Any, api_key: str, database_url: str
) -> None:
    csrf = _sign_in(published, api_key)
    # Whatever makes a list slow — a filter the plans cannot serve, a table locked by a
    # migration — the console answers within its bound instead of holding a process.
    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE executions IN ACCESS EXCLUSIVE MODE")
        listing = published.get("/ui/executions?path=customer.id&value=7")
        bulk = published.get("/ui/bulk?action=cancel")
        confirmed = published.post(
            "/ui/bulk", data={"csrf": csrf, "action": "cancel", "upto": str(uuid.uuid4())}
        )
        blocker.rollback()
    for r in (listing, bulk, confirmed):
        text = r.get_data(as_text=True)
        assert r.status_code == 422, text
        assert "Filter too expensive" in text and "narrow it" in text
    assert published.get("/ui/executions").status_code == 200
