"""Issue 28/29 leftovers against the real database and the in-process API and console:
webhooks routed through a source are archived and re-ingested like a workflow's own; a
replay whose original retention deleted says so; the console's re-ingest page (dry run,
then a CSRF-guarded confirmation); the input schema in the console and its diff; and
retention of the events no subscription matched."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg_pool
import pytest

from flowforge.store import apikeys
from flowforge.worker.retention import UNMATCHED_PER_SOURCE, Retention
from tests.integration.test_console import _sign_in
from tests.integration.test_retention import finish
from tests.support import inprocess
from tests.support.definitions import unsigned
from tests.support.webhooks import github_header

STEPS = [{"id": "a", "type": "transform", "output": {"kind": "{{ input.kind }}"}}]
SECRET = "a-source-secret-of-enough-length"


@pytest.fixture
def pool(database_url: str) -> Iterator[psycopg_pool.ConnectionPool]:
    with inprocess.pool(database_url, "test-leftovers") as made:
        yield made


def publish(client: Any, key: str, **options: Any) -> None:
    r = client.post(f"/api/v1/workflows/{key}/versions", json={**unsigned(STEPS), **options})
    assert r.status_code == 201, r.get_data(as_text=True)


def window() -> dict[str, str]:
    now = datetime.now(UTC)
    return {
        "from": (now - timedelta(hours=1)).isoformat(),
        "to": (now + timedelta(hours=1)).isoformat(),
    }


def deliver(client: Any, body: dict[str, Any]) -> Any:
    raw = json.dumps(body).encode()
    headers = {
        "X-Hub-Signature-256": github_header(SECRET, raw),
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-GitHub-Event": "push",
    }
    return client.post("/hooks/gh", data=raw, headers=headers, content_type="application/json")


def test_a_routed_webhook_is_archived_per_execution_and_reingested(
    open_client: Any, db: psycopg.Connection
) -> None:
    publish(open_client, "kept", archive_days=1)
    publish(open_client, "unkept")
    source = {"auth": "github", "subscriptions": [{"workflow": "kept"}, {"workflow": "unkept"}]}
    assert open_client.post("/api/v1/sources/gh", json=source).status_code == 200
    r = open_client.post("/api/v1/sources/gh/webhook-secrets", json={"value": SECRET})
    secret_id = r.get_json()["id"]
    answer = deliver(open_client, {"kind": "a"})
    assert answer.status_code == 202, answer.get_data(as_text=True)
    by_workflow = {e["workflow"]: e["execution_id"] for e in answer.get_json()["executions"]}
    rows = db.execute(
        "SELECT execution_id::text, body, headers, auth_scheme, secret_id, source_id"
        " FROM webhook_deliveries"
    ).fetchall()
    (source_id,) = db.execute("SELECT id FROM sources WHERE name = 'gh'").fetchone()  # type: ignore[misc]
    # Only the workflow that archives keeps it, with the source's scheme and secret.
    [(execution_id, body, headers, scheme, verified_by, via)] = rows
    assert execution_id == by_workflow["kept"]
    assert json.loads(bytes(body)) == {"kind": "a"}
    assert (scheme, verified_by, via) == ("github", secret_id, source_id)
    assert headers["x-github-event"] == "push" and "x-hub-signature-256" not in headers
    r = open_client.post("/api/v1/workflows/kept/reingest", json=window())
    assert r.status_code == 200, r.get_data(as_text=True)
    [created] = r.get_json()["created"]
    assert created["execution_id"] != execution_id


def test_a_replay_says_when_retention_deleted_its_original(
    open_client: Any, db: psycopg.Connection, pool: psycopg_pool.ConnectionPool, api_key: str
) -> None:
    publish(open_client, "short", retention_days=0.001)
    original = open_client.post("/hooks/short", json={"kind": "a"}).get_json()["execution_id"]
    finish(db, original, "failed", "1 hour")
    r = open_client.post(f"/api/v1/executions/{original}/replay", json={"from_step": "a"})
    assert r.status_code == 201, r.get_data(as_text=True)
    replay_id = r.get_json()["execution_id"]
    shown = open_client.get(f"/api/v1/executions/{replay_id}").get_json()
    assert (shown["replay_of"], shown["replay_of_deleted"]) == (original, False)
    Retention(pool, threading.Event()).expire()
    assert db.execute("SELECT 1 FROM executions WHERE id = %s", (original,)).fetchone() is None
    shown = open_client.get(f"/api/v1/executions/{replay_id}").get_json()
    assert (shown["replay_of"], shown["replay_of_deleted"]) == (original, True)
    open_client.environ_base.pop("HTTP_AUTHORIZATION")
    _sign_in(open_client, api_key)
    page = open_client.get(f"/ui/executions/{replay_id}").get_data(as_text=True)
    assert f'<span class="mono" id="replay-of">{original}</span>' in page
    assert "original deleted by retention" in page


def test_the_console_reingest_page_previews_then_reingests_on_confirmation(
    open_client: Any, db: psycopg.Connection, api_key: str
) -> None:
    publish(open_client, "orders", archive_days=1)
    for kind in ("a", "b", "a"):
        assert open_client.post("/hooks/orders", json={"kind": kind}).status_code == 202
    open_client.environ_base.pop("HTTP_AUTHORIZATION")
    csrf = _sign_in(open_client, api_key)
    assert 'id="reingest-link"' in open_client.get("/ui/workflows/orders").get_data(as_text=True)
    filter_ = json.dumps({"path": "input.kind", "op": "eq", "value": "a"})
    before = db.execute("SELECT count(*) FROM executions").fetchone()
    page = open_client.get(
        "/ui/workflows/orders/reingest", query_string={**window(), "filter": filter_}
    )
    text = page.get_data(as_text=True)
    assert page.status_code == 200, text
    assert '<b id="preview-count">2</b>' in text and 'id="confirm"' in text
    assert db.execute("SELECT count(*) FROM executions").fetchone() == before  # a dry run
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', text))
    assert fields["csrf"] == csrf
    fields = {k: v.replace("&#34;", '"') for k, v in fields.items()}
    forged = open_client.post("/ui/workflows/orders/reingest", data={**fields, "csrf": "x"})
    assert forged.status_code == 403
    done = open_client.post("/ui/workflows/orders/reingest", data=fields).get_data(as_text=True)
    assert '<b id="created">2</b> created' in done and 'id="finished"' in done
    again = open_client.post("/ui/workflows/orders/reingest", data=fields).get_data(as_text=True)
    assert '<b id="created">0</b> created, <b id="existing">2</b>' in again
    bad = open_client.get(
        "/ui/workflows/orders/reingest", query_string={**window(), "filter": "{nope"}
    )
    assert bad.status_code == 422 and "filter must be JSON" in bad.get_data(as_text=True)
    bad = open_client.get("/ui/workflows/orders/reingest", query_string={"from": "yesterday"})
    assert bad.status_code == 422
    _, viewer = apikeys.create(db, "viewer", read_only=True)
    open_client.post("/ui/signout", data={"csrf": csrf})
    _sign_in(open_client, viewer)
    assert open_client.get("/ui/workflows/orders/reingest").status_code == 403
    page = open_client.get("/ui/workflows/orders").get_data(as_text=True)
    assert 'id="reingest-link"' not in page


def test_the_console_shows_the_input_schema_and_its_diff(open_client: Any, api_key: str) -> None:
    schema = {"type": "object", "required": ["kind"]}
    publish(open_client, "typed")
    publish(open_client, "typed", input_schema=schema)
    open_client.environ_base.pop("HTTP_AUTHORIZATION")
    _sign_in(open_client, api_key)
    page = open_client.get("/ui/workflows/typed").get_data(as_text=True)
    assert 'id="input-schema"' in page and "&#34;required&#34;" in page
    diff = re.search(r'<pre class="diff" id="diff-text">(.*?)</pre>', page, re.S).group(1)
    assert "+ $.input_schema" in diff
    assert 'id="input-schema"' not in open_client.get("/ui/workflows/typed?version=1").get_data(
        as_text=True
    )


def test_unmatched_source_events_are_kept_30_days_and_10000_per_source(
    open_client: Any, db: psycopg.Connection, pool: psycopg_pool.ConnectionPool
) -> None:
    publish(open_client, "kept")
    for name in ("noisy", "quiet"):
        source = {"auth": "none", "subscriptions": [{"workflow": "kept", "filter": {"all": [
            {"path": "input.kind", "op": "eq", "value": "never"}]}}]}  # fmt: skip
        assert open_client.post(f"/api/v1/sources/{name}", json=source).status_code == 200
    assert open_client.post("/hooks/quiet", json={"kind": "x"}).status_code == 202
    assert open_client.post("/hooks/quiet", json={"kind": "old"}).status_code == 202
    db.execute(
        "UPDATE source_unmatched SET received_at = now() - interval '31 days'"
        " WHERE input->>'kind' = 'old'"
    )
    db.execute(
        "INSERT INTO source_unmatched (source_id, input)"
        " SELECT s.id, jsonb_build_object('n', n) FROM sources s, generate_series(1, %s) n"
        " WHERE s.name = 'noisy'",
        (UNMATCHED_PER_SOURCE + 7,),
    )
    Retention(pool, threading.Event(), batch=5000).expire_unmatched()
    kept = dict(
        db.execute(
            "SELECT s.name, count(*) FROM source_unmatched u JOIN sources s ON s.id = u.source_id"
            " GROUP BY 1"
        ).fetchall()
    )
    assert kept == {"noisy": UNMATCHED_PER_SOURCE, "quiet": 1}
    (oldest,) = db.execute(
        "SELECT min((input->>'n')::int) FROM source_unmatched WHERE input ? 'n'"
    ).fetchone()  # type: ignore[misc]
    assert oldest == 8  # the newest ten thousand stay
