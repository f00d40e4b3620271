"""The webhook intake on real PostgreSQL: one transaction, idempotency, pinning, rollback."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
import requests

from tests.support.api import Api
from tests.support.definitions import unsigned

# In the fast lane (bin/test --fast, docs/howto/develop.md).
pytestmark = pytest.mark.fast

CHAIN = unsigned(
    [
        {"id": "a", "type": "transform", "output": {"n": "{{ input.n }}"}},
        {"id": "b", "type": "transform", "depends_on": ["a"], "output": "{{ a.n }}"},
        {"id": "c", "type": "transform", "output": 1},
    ],
    name="Chain",
)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def hook(client: Any, workflow: str, body: bytes, **headers: str) -> Any:
    return client.post(
        f"/hooks/{workflow}", data=body, headers={"Content-Type": "application/json", **headers}
    )


def counts(db: psycopg.Connection) -> dict[str, int]:
    tables = ("executions", "steps", "outbox", "idempotency_keys", "execution_events")
    return {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}


def published(client: Any, key: str, definition: dict[str, Any] = CHAIN) -> None:
    r = client.post("/api/v1/workflows/chain/versions", json=definition, headers=auth(key))
    assert r.status_code == 201, r.get_data(as_text=True)


def test_webhook_writes_execution_steps_outbox_and_event_together(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    published(app_client, api_key)
    r = hook(app_client, "chain", b'{"n": 5}')
    assert r.status_code == 202
    eid = r.get_json()["execution_id"]
    assert r.get_json()["status"] == "queued"
    assert r.headers["Location"] == f"/api/v1/executions/{eid}"
    steps = dict(db.execute("SELECT step_id, status FROM steps ORDER BY position").fetchall())
    assert steps == {"a": "ready", "b": "pending", "c": "ready"}
    assert sorted(r[0] for r in db.execute("SELECT step_id FROM outbox")) == ["a", "c"]
    shown = app_client.get(f"/api/v1/executions/{eid}", headers=auth(api_key)).get_json()
    assert shown["status"] == "queued" and shown["input"] == {"n": 5}
    assert [e["kind"] for e in shown["events"]] == ["execution.queued"]


def test_same_key_same_body_replays_and_a_different_body_conflicts(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    published(app_client, api_key)
    first = hook(app_client, "chain", b'{"n": 1}', **{"Idempotency-Key": "k1"})
    again = hook(app_client, "chain", b'{"n": 1}', **{"Idempotency-Key": "k1"})
    assert again.status_code == 202
    assert again.get_json()["execution_id"] == first.get_json()["execution_id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    before = counts(db)
    changed = hook(app_client, "chain", b'{"n":  1}', **{"Idempotency-Key": "k1"})
    assert changed.status_code == 409
    assert changed.mimetype == "application/problem+json"
    assert counts(db) == before
    # webhook-id is the key when there is no Idempotency-Key
    one = hook(app_client, "chain", b"{}", **{"webhook-id": "msg_1"})
    two = hook(app_client, "chain", b"{}", **{"webhook-id": "msg_1"})
    assert one.get_json()["execution_id"] == two.get_json()["execution_id"]
    # no key at all: every call is a new execution
    assert (
        hook(app_client, "chain", b"{}").get_json()["execution_id"]
        != hook(app_client, "chain", b"{}").get_json()["execution_id"]
    )


def test_bad_webhooks_are_refused_and_create_nothing(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    published(app_client, api_key)
    before = counts(db)
    assert hook(app_client, "missing", b"{}").status_code == 404
    assert hook(app_client, "chain", b"{nope").status_code == 400
    assert (
        app_client.post(
            "/hooks/chain", data=b"a=1", content_type="application/x-www-form-urlencoded"
        ).status_code
        == 415
    )
    assert hook(app_client, "chain", b"{}", **{"Content-Encoding": "gzip"}).status_code == 415
    assert hook(app_client, "chain", b'{"x": "' + b"a" * 70_000 + b'"}').status_code == 413
    assert (
        app_client.post("/hooks/chain?x=1", data=b"{}", content_type="application/json").status_code
        == 400
    )
    assert hook(app_client, "chain", b"{}", **{"Idempotency-Key": "k" * 300}).status_code == 400
    leaked = hook(app_client, "chain", b'{"password": "hunter2"')
    assert leaked.status_code == 400 and "hunter2" not in leaked.get_data(as_text=True)
    assert counts(db) == before


def test_signature_is_the_default_auth(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    definition = {k: v for k, v in CHAIN.items() if k != "trigger"}
    published(app_client, api_key, definition)
    r = hook(app_client, "chain", b"{}")
    assert r.status_code == 401
    assert counts(db)["executions"] == 0


def test_executions_stay_pinned_to_the_version_they_arrived_under(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    published(app_client, api_key)
    old = hook(app_client, "chain", b"{}").get_json()["execution_id"]
    published(app_client, api_key, {**CHAIN, "steps": [CHAIN["steps"][2]]})
    new = hook(app_client, "chain", b"{}").get_json()["execution_id"]
    shown = {
        eid: app_client.get(f"/api/v1/executions/{eid}", headers=auth(api_key)).get_json()
        for eid in (old, new)
    }
    assert shown[old]["version"] == 1 and len(shown[old]["steps"]) == 3
    assert shown[new]["version"] == 2 and [s["id"] for s in shown[new]["steps"]] == ["c"]


def test_keyset_pagination_walks_every_execution_once(app_client: Any, api_key: str) -> None:
    published(app_client, api_key)
    created = {hook(app_client, "chain", b"{}").get_json()["execution_id"] for _ in range(7)}
    seen: list[str] = []
    cursor = None
    while True:
        query = "/api/v1/executions?workflow=chain&limit=3" + (
            f"&cursor={cursor}" if cursor else ""
        )
        page = app_client.get(query, headers=auth(api_key)).get_json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == 7 and set(seen) == created
    queued = app_client.get(
        "/api/v1/executions?status=queued&limit=50", headers=auth(api_key)
    ).get_json()
    assert len(queued["items"]) == 7
    none = app_client.get("/api/v1/executions?status=failed", headers=auth(api_key)).get_json()
    assert none["items"] == []


def test_a_number_jsonb_cannot_hold_is_a_400_and_every_stored_one_loads_again(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    published(app_client, api_key)
    # Python reads both as 0.0; PostgreSQL's numeric holds 16383 digits after the point.
    for body in (b'{"n": 1e-20000}', b'{"n": 0.' + b"0" * 16_383 + b"1}"):
        r = hook(app_client, "chain", body)
        assert r.status_code == 400, r.get_data(as_text=True)
        assert r.get_json()["title"] == "Unsupported JSON"
    assert counts(db)["executions"] == 0
    edge = hook(app_client, "chain", b'{"n": 1e-16383, "big": 1e308, "long": 0.5e-16382}')
    assert edge.status_code == 202, edge.get_data(as_text=True)
    shown = app_client.get(
        f"/api/v1/executions/{edge.get_json()['execution_id']}", headers=auth(api_key)
    )
    assert shown.status_code == 200, shown.get_data(as_text=True)
    assert shown.get_json()["input"]["big"] == 10**308


def test_needs_attention_lists_every_unknown_step_through_its_partial_index(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    from flowforge.store.timeline import NEEDS_ATTENTION_PAGE

    published(app_client, api_key)
    ids = [hook(app_client, "chain", b"{}").get_json()["execution_id"] for _ in range(5)]
    # As the worker leaves them: one needs_attention, one cancelled around an unknown step,
    # one running with an unknown branch; the others hold no unknown step.
    for eid, status in zip(ids[:3], ("needs_attention", "cancelled", "running"), strict=True):
        db.execute("UPDATE executions SET status = %s WHERE id = %s", (status, eid))
        db.execute(
            "UPDATE steps SET status = 'unknown' WHERE execution_id = %s AND step_id = 'c'", (eid,)
        )
    db.execute("UPDATE executions SET status = 'cancelled' WHERE id = %s", (ids[3],))

    pages, cursor = [], None
    while True:
        query = "/api/v1/executions?status=needs_attention&limit=2"
        page = app_client.get(
            query + (f"&cursor={cursor}" if cursor else ""), headers=auth(api_key)
        ).get_json()
        pages.append([(i["id"], i["status"]) for i in page["items"]])
        if not (cursor := page["next_cursor"]):
            break
    listed = [item for page in pages for item in page]
    assert listed == [(ids[2], "running"), (ids[1], "cancelled"), (ids[0], "needs_attention")]

    # Index-backed: even with sequential scans priced out, the plan reaches the steps
    # through steps_unknown and never reads the whole table.
    db.execute("SET enable_seqscan = off")
    plan = "\n".join(
        row[0]
        for row in db.execute(
            "EXPLAIN " + NEEDS_ATTENTION_PAGE,
            {
                "workflow": None,
                "workflows": None,
                "after": None,
                "since": None,
                "until": None,
                "limit": 50,
            },
        )
    )
    assert "steps_unknown" in plan, plan
    assert "Seq Scan on steps" not in plan, plan


def test_twenty_identical_requests_racing_through_gunicorn_create_one_execution(
    api: str, api_key: str, db: psycopg.Connection
) -> None:
    Api(api, api_key).publish("chain", CHAIN)
    body = json.dumps({"n": 1}).encode()

    def send(_: int) -> requests.Response:
        return requests.post(
            f"{api}/hooks/chain",
            data=body,
            timeout=10,
            headers={"Content-Type": "application/json", "Idempotency-Key": "race-1"},
        )

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(send, range(20)))
    assert {r.status_code for r in answers} == {202}
    assert len({r.json()["execution_id"] for r in answers}) == 1
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in answers) == 19
    assert counts(db)["executions"] == 1


def test_a_failing_outbox_insert_rolls_the_whole_intake_back(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    published(app_client, api_key)
    before = counts(db)
    db.execute("""
        CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'outbox insert refused by test'; END $$;
        CREATE TRIGGER refuse BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION refuse();
    """)
    r = hook(app_client, "chain", b"{}", **{"Idempotency-Key": "k-rollback"})
    assert r.status_code == 500
    assert r.mimetype == "application/problem+json"
    assert "refused by test" not in r.get_data(as_text=True)
    assert counts(db) == before
    db.execute("DROP TRIGGER refuse ON outbox")
    retried = hook(app_client, "chain", b"{}", **{"Idempotency-Key": "k-rollback"})
    assert retried.status_code == 202
    assert "Idempotent-Replayed" not in retried.headers
    assert counts(db)["executions"] == before["executions"] + 1


def test_a_webhook_flood_gets_429_with_retry_after_and_liveness_stays_up(
    database_url: str, api_key: str
) -> None:
    from flowforge.api import create_app
    from flowforge.store.config import Settings

    app = create_app(Settings(database_url=database_url, webhook_rate=2.0))
    app.extensions["flowforge.pool"].wait(timeout=10)
    client = app.test_client()
    try:
        published(client, api_key)
        answers = [hook(client, "chain", b"{}") for _ in range(5)]
        codes = [r.status_code for r in answers]
        assert codes[:2] == [202, 202] and 429 in codes[2:]
        limited = next(r for r in answers if r.status_code == 429)
        assert int(limited.headers["Retry-After"]) >= 1
        assert limited.mimetype == "application/problem+json"
        assert client.get("/healthz").status_code == 200
    finally:
        app.extensions["flowforge.pool"].close()


def test_a_keys_slot_holders_are_counted_through_their_index_not_the_workflows_history(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    """Under a key's slot lock every intake, hand-over and retry counts the key's holders;
    with 20,000 ended executions of the workflow that count must still read a few index
    pages (the 0020 index was partial on a predicate the count no longer implied, so it
    read the whole history under the lock)."""
    from flowforge.store.flowcontrol import RETRY_SLOT

    published(app_client, api_key, {**CHAIN, "concurrency": {"limit": 2}})
    eid = hook(app_client, "chain", b'{"n": 1}').get_json()["execution_id"]
    db.execute(
        """
        INSERT INTO executions (id, workflow_id, version_id, status, input, concurrency_key,
                                slot_at)
        SELECT gen_random_uuid(), workflow_id, version_id, 'succeeded', input,
               concurrency_key, now()
        FROM executions, generate_series(1, 20000) WHERE id = %(id)s
        """,
        {"id": eid},
    )
    db.execute("ANALYZE executions")
    (plan,) = db.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + RETRY_SLOT, {"id": eid}
    ).fetchone()
    assert "executions_slot_holders" in json.dumps(plan), plan
    top = plan[0]["Plan"]
    assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] < 50, top
    # And the count is right: the one live holder besides itself is none.
    assert db.execute(RETRY_SLOT, {"id": eid}).fetchone() == (2, 0)
