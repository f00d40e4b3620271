"""Archive and re-ingest (docs/contract.md#reingest, docs/contract.md#system-keys) in the test's
process (`in_process`: the API app, and the executor where the re-ingested executions run), and
the remote CLI against a real bin/api: what the archive keeps of a webhook
(never a credential nor the secret), re-ingest of a filtered range onto the newest version exactly
once, a client key spelled like a re-ingest's, dry run, the cap, and the archive's retention."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from flowforge.store import apikeys
from flowforge.worker.retention import Retention
from tests.integration.test_api_keys import cli
from tests.integration.test_cli_remote import ok, remote
from tests.support import inprocess
from tests.support.api import Api
from tests.support.definitions import workflow
from tests.support.inprocess import InProcess
from tests.support.webhooks import sign

STEPS = [{"id": "shape", "type": "transform", "output": {"kind": "{{ input.kind }}"}}]


def definition(archive_days: float | None = 1, auth: str = "none", **extra: Any) -> dict[str, Any]:
    archive = {} if archive_days is None else {"archive_days": archive_days}
    return workflow(*STEPS, auth=auth, **{"name": "orders", **extra, **archive})


@pytest.fixture
def client(in_process: InProcess) -> InProcess:
    """The API app and the executor in the test's process: what these tests check is the
    API's and the store's, not a process's."""
    return in_process


def window() -> dict[str, str]:
    now = datetime.now(UTC)
    return {
        "from": (now - timedelta(hours=1)).isoformat(),
        "to": (now + timedelta(hours=1)).isoformat(),
    }


def reingest(client: Api | InProcess, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = client.post("/api/v1/workflows/orders/reingest", body)
    assert r.status_code == status, r.text
    return r.json()


def deliveries(db: psycopg.Connection) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT id, execution_id::text, body, headers, auth_scheme, secret_id"
        " FROM webhook_deliveries ORDER BY id"
    ).fetchall()


def count_executions(db: psycopg.Connection) -> int:
    return db.execute("SELECT count(*) FROM executions").fetchone()[0]  # type: ignore[index]


def test_the_archive_keeps_the_body_and_what_verified_it_never_a_credential(
    client: InProcess, db: psycopg.Connection
) -> None:
    client.publish("orders", definition(auth="signature"))
    created = client.post("/api/v1/workflows/orders/webhook-secrets").json()
    secret_id, secret = created["id"], created["secret"]
    body = b'{"kind":  "a", "n": 1}'  # kept byte for byte, spacing included
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "webhook-id": "msg_1",
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, "msg_1", timestamp, body),
        "Authorization": "Bearer sender-credential-xyz",
        "Cookie": "session=cookie-credential-xyz",
        "User-Agent": "sender/1.0",
        "X-Hub-Signature-256": "sha256=deadbeef",
    }
    execution_id = client.start("orders", None, raw=body, headers=headers)
    [(delivery_id, linked, kept, kept_headers, scheme, verified_by)] = deliveries(db)
    assert bytes(kept) == body and linked == execution_id
    assert kept_headers == {
        "content-type": "application/json",
        "user-agent": "sender/1.0",
        "webhook-id": "msg_1",
        "webhook-timestamp": str(timestamp),
    }
    assert (scheme, verified_by) == ("signature", secret_id)
    row_text = json.dumps(kept_headers) + bytes(kept).decode()
    for credential in ("xyz", secret, secret.removeprefix("whsec_"), "deadbeef", "v1,"):
        assert credential not in row_text
    (delivery,) = db.execute(
        "SELECT delivery_id FROM executions WHERE id = %s", (execution_id,)
    ).fetchone()  # type: ignore[misc]
    assert delivery == delivery_id


def test_no_archive_unless_the_definition_asks(client: InProcess, db: psycopg.Connection) -> None:
    client.publish("orders", definition(archive_days=None))
    client.start("orders", {"kind": "a"})
    assert deliveries(db) == []
    r = client.post("/api/v1/workflows/orders/versions", definition(archive_days=-1))
    assert r.status_code == 422 and r.json()["errors"][0]["path"] == "$.archive_days"


def test_reingest_a_filtered_range_onto_the_newest_version_once(
    client: InProcess, db: psycopg.Connection
) -> None:
    client.publish("orders", definition())
    originals = [client.start("orders", {"kind": kind, "n": n}) for n, kind in enumerate("abab")]
    client.publish("orders", definition(name="orders v2"))
    before = count_executions(db)
    only_a = {**window(), "filter": {"path": "input.kind", "op": "eq", "value": "a"}}

    dry = reingest(client, {**only_a, "dry_run": True})
    assert dry["matched"] == 2 and dry["next"] is None
    assert [s["input"] for s in dry["sample"]] == [{"kind": "a", "n": 0}, {"kind": "a", "n": 2}]
    assert count_executions(db) == before  # a dry run creates nothing

    done = reingest(client, only_a)
    assert len(done["created"]) == 2 and done["existing"] == [] and done["version"] == 2
    archived = {row[1]: row[0] for row in deliveries(db)}
    assert [c["delivery_id"] for c in done["created"]] == [
        archived[originals[0]],
        archived[originals[2]],
    ]
    for created in done["created"]:
        delivery_id, execution_id = created["delivery_id"], created["execution_id"]
        row = db.execute(
            "SELECT v.version, x.delivery_id, x.input, k.origin, k.key FROM executions x"
            " JOIN workflow_versions v ON v.id = x.version_id"
            " JOIN idempotency_keys k ON k.execution_id = x.id WHERE x.id = %s",
            (execution_id,),
        ).fetchone()
        assert row is not None
        assert row[:2] == (2, delivery_id) and row[2]["kind"] == "a"
        assert row[3:] == ("system", f"reingest:{delivery_id}")
        history = client.execution(execution_id)
        assert history["status"] in {"queued", "running", "succeeded"}
        (detail,) = db.execute(
            "SELECT detail FROM execution_events WHERE execution_id = %s ORDER BY id LIMIT 1",
            (execution_id,),
        ).fetchone()  # type: ignore[misc]
        assert detail["reingest_of"] == delivery_id and detail["actor"]["name"] == "tests"
    assert count_executions(db) == before + 2

    again = reingest(client, only_a)
    assert again["created"] == [] and again["existing"] == done["created"]
    assert count_executions(db) == before + 2

    for created in done["created"]:
        finished = client.wait(created["execution_id"])
        assert finished["status"] == "succeeded", finished


def test_a_client_key_spelled_like_a_reingest_neither_blocks_nor_claims_it(
    client: InProcess, db: psycopg.Connection
) -> None:
    client.publish("orders", definition())
    original = client.start("orders", {"kind": "a"})
    [(delivery_id, *_)] = deliveries(db)
    # Same body, the very key the re-ingest of that delivery will use, both headers.
    spoofed = {
        client.start("orders", {"kind": "a"}, headers={header: f"reingest:{delivery_id}"})
        for header in ("Idempotency-Key", "webhook-id")
    }
    assert len(spoofed) == 1 and original not in spoofed
    done = reingest(client, window())
    mine = {c["delivery_id"]: c["execution_id"] for c in done["created"]}
    assert delivery_id in mine and mine[delivery_id] not in spoofed | {original}
    assert done["existing"] == []


def test_the_cap_is_honoured_and_next_continues(client: InProcess, db: psycopg.Connection) -> None:
    client.publish("orders", definition())
    for n in range(5):
        client.start("orders", {"kind": "a", "n": n})
    first = reingest(client, {**window(), "limit": 2})
    assert len(first["created"]) == 2 and first["next"] is not None
    rest = reingest(client, {**window(), "limit": 500, "after": first["next"]})
    assert len(rest["created"]) == 3 and rest["next"] is None
    made = [c["delivery_id"] for c in first["created"] + rest["created"]]
    assert made == [row[0] for row in deliveries(db)]
    bad = reingest(client, {**window(), "limit": 501}, status=422)
    assert bad["errors"][0]["path"] == "$.limit"


def test_bad_requests_and_read_only_keys_are_refused(
    client: InProcess, db: psycopg.Connection
) -> None:
    client.publish("orders", definition())
    client.start("orders", {"kind": "a"})
    before = count_executions(db)
    problem = reingest(
        client, {"from": "yesterday", "to": window()["to"], "filter": {"op": "eq"}}, status=422
    )
    assert {e["path"] for e in problem["errors"]} >= {"$.from", "$.filter.path"}
    _, viewer = apikeys.create(db, "viewer", read_only=True)
    r = client.app.post(
        "/api/v1/workflows/orders/reingest",
        json=window(),
        headers={"Authorization": f"Bearer {viewer}"},
    )
    assert r.status_code == 403, r.text
    assert count_executions(db) == before


def test_archived_webhooks_are_deleted_after_archive_days(
    client: InProcess, db: psycopg.Connection, database_url: str
) -> None:
    client.publish("orders", definition(archive_days=2))
    executions = [client.start("orders", {"kind": "a", "n": n}) for n in range(3)]
    db.execute(
        "UPDATE webhook_deliveries SET received_at = now() - interval '3 days'"
        " WHERE execution_id = ANY(%s::uuid[])",
        (executions[:2],),
    )
    with inprocess.pool(database_url, "test-archive-retention") as pool:
        retention = Retention(pool, threading.Event(), batch=1)
        assert retention.expire_archive() == (2, True)
        assert [row[1] for row in deliveries(db)] == [executions[2]]
        # The executions themselves follow retention_days, not archive_days.
        assert count_executions(db) == 3
        # archive_days 0 on the newest version: nothing is kept any more.
        client.publish("orders", definition(archive_days=0))
        assert retention.expire_archive() == (1, True)
        assert deliveries(db) == []


def test_reingest_from_the_cli_remote_and_on_the_box(
    api: str, api_key: str, database_url: str, db: psycopg.Connection
) -> None:
    client = Api(api, api_key)  # the remote CLI talks HTTP to a real bin/api
    client.publish("orders", definition())
    for kind in "abc":
        client.start("orders", {"kind": kind})
    span = window()
    only_b = json.dumps({"path": "input.kind", "op": "ne", "value": "b"})
    args = ["workflow", "reingest", "orders", "--from", span["from"], "--to", span["to"]]
    preview = ok(remote(client.base, api_key, *args, "--filter", only_b, "--dry-run"))
    assert "2 archived webhooks would be re-ingested" in preview
    assert count_executions(db) == 3
    done = ok(remote(client.base, api_key, *args, "--filter", only_b))
    assert "2 executions created, 0 already re-ingested, 0 refused" in done
    # On the box: the rest of the range; what the API made is not made again.
    left = json.loads(ok(cli(database_url, *args, "--output", "json")))
    assert left == {"created": 1, "existing": 2, "refused": []}
    actors = db.execute(
        "SELECT detail->'actor'->>'kind', count(*) FROM execution_events"
        " WHERE detail ? 'reingest_of' GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert actors == [("api_key", 2), ("cli", 1)]
    bad = remote(client.base, api_key, *args, "--filter", "{not json")
    assert bad.returncode != 0 and "--filter is not JSON" in bad.stderr


def test_a_workflow_with_flow_control_archives_and_reingests_through_its_gate(
    client: InProcess, db: psycopg.Connection
) -> None:
    client.publish("orders", definition(concurrency={"limit": 1}))
    made = [client.start("orders", {"kind": "a", "n": n}) for n in range(2)]
    rows = deliveries(db)
    assert [row[1] for row in rows] == made
    linked = db.execute(
        "SELECT id::text, delivery_id FROM executions ORDER BY created_at, id"
    ).fetchall()
    assert linked == [(row[1], row[0]) for row in rows]
    done = reingest(client, window())
    assert [c["delivery_id"] for c in done["created"]] == [row[0] for row in rows]
    statuses = db.execute(
        "SELECT k.origin, x.status FROM executions x JOIN idempotency_keys k"
        " ON k.execution_id = x.id WHERE x.id = ANY(%s::uuid[])",
        ([c["execution_id"] for c in done["created"]],),
    ).fetchall()
    assert statuses == [("system", "queued")] * 2
