"""The console says what is so: a wrong key at sign-in gets the form back with the
error; a schedule-only workflow shows no webhook auth; a workflow with one version
offers no diff, and two versions are diffed structurally in the author's order; the
retry button says what it re-runs; the pages carry a favicon."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from tests.integration.test_console import CSRF, _sign_in


def test_a_wrong_key_at_sign_in_shows_the_form_again_with_the_error(
    published: Any,
) -> None:
    page = published.get("/ui/signin").get_data(as_text=True)
    token = CSRF.search(page).group(1)
    r = published.post("/ui/signin", data={"csrf": token, "api_key": "ff_wrong"})
    answer = r.get_data(as_text=True)
    assert r.status_code == 401
    assert 'id="signin-error"' in answer and "not valid" in answer
    # A fresh form that works: the right key signs in from it.
    assert 'name="api_key"' in answer and CSRF.search(answer)


def test_the_workflow_pages_tell_the_trigger_and_diff_in_the_authors_order(
    published: Any,
    api_key: str,
) -> None:
    auth = {"Authorization": f"Bearer {api_key}"}
    sweep = {
        "trigger": {"schedule": {"every_s": 3600}},
        "name": "Sweep",
        "steps": [{"id": "note", "type": "transform", "output": {"n": 1}}],
    }
    r = published.post("/api/v1/workflows/sweep/versions", json=sweep, headers=auth)
    assert r.status_code == 201, r.get_data(as_text=True)
    # Read back in the author's order (jsonb would put `name` first and `trigger` last).
    shown = published.get("/api/v1/workflows/sweep/versions/1", headers=auth).get_json()
    assert list(shown["definition"]) == ["trigger", "name", "steps"]

    _sign_in(published, api_key)
    page = published.get("/ui/workflows/sweep").get_data(as_text=True)
    versions = page.split('id="versions"')[1].split("</table>")[0]
    assert "<td>schedule</td>" in versions and "signature" not in versions
    assert 'id="diff"' not in page  # one version: nothing to compare
    listing = published.get("/ui/workflows").get_data(as_text=True)
    assert "<td>schedule</td>" in listing
    assert "webhook (webhook auth: none)" in listing  # `open`

    sweep["steps"][0]["output"] = {"n": 2}
    sweep["retention_days"] = 7
    published.post("/api/v1/workflows/sweep/versions", json=sweep, headers=auth)
    page = published.get("/ui/workflows/sweep?a=1&b=2").get_data(as_text=True)
    diff = re.search(r'<pre class="diff" id="diff-text">(.*?)</pre>', page, re.DOTALL).group(1)
    lines = re.findall(r'<span class="(\w+)">([^<]*)</span>', diff)
    assert lines == [
        ("file", "--- version 1"),
        ("file", "+++ version 2"),
        ("change", "~ $.steps[id=note].output.n: 1 → 2"),
        ("add", "+ $.retention_days: 7"),
    ]
    same = published.get("/ui/workflows/sweep?a=2&b=2").get_data(as_text=True)
    assert "the same version" in same


def test_retry_says_what_it_re_runs_and_the_pages_have_a_favicon(
    published: Any,
    api_key: str,
    db: psycopg.Connection,
) -> None:
    (eid,) = db.execute("SELECT id::text FROM executions ORDER BY id LIMIT 1").fetchone()
    # Cancelled before anything ran: nothing failed, one step cancelled.
    db.execute("UPDATE executions SET status = 'cancelled' WHERE id = %s", (eid,))
    db.execute("UPDATE steps SET status = 'cancelled' WHERE execution_id = %s", (eid,))
    _sign_in(published, api_key)
    page = published.get(f"/ui/executions/{eid}").get_data(as_text=True)
    button = re.search(r'<button type="submit" id="retry">([^<]*)</button>', page).group(1)
    assert button == "Re-run cancelled steps"
    assert "Retry failed steps" not in page
    icon = re.search(r'<link rel="icon" type="image/svg\+xml" href="([^"]+)"', page).group(1)
    served = published.get(icon)
    assert served.status_code == 200 and b"<svg" in served.get_data()
