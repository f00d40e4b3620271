"""docs/contract.md#system-keys: every identity FlowForge makes for itself lives in a key space no
client key can reach. Against a real bin/api and bin/worker: a webhook sender who posts
`Idempotency-Key: schedule:<next instant>` (or `webhook-id: schedule:<...>`), with the
very body the tick would carry, neither suppresses the tick nor is handed its execution,
and a backfill's dry run and the real backfill agree about ticks a sender pre-claimed; a
sender who claims a child's key spellings does not become the child. (Sources:
test_source_identity.py; re-ingests: test_archive_reingest.py; every site in the code:
tests/unit/test_key_spaces.py.)"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import requests

from tests.support.api import Api
from tests.support.processes import Process, wait_for

EVERY_S = 2
DEFINITION = {
    "name": "ticking",
    "trigger": {
        "webhook": {"auth": "none"},
        "schedule": {"every_s": EVERY_S, "overlap": "allow", "input": {}},
    },
    "steps": [{"id": "shape", "type": "transform", "output": {"at": "{{ input.scheduled_at }}"}}],
}


@pytest.fixture
def client(api: str, api_key: str) -> Api:
    return Api(api, api_key)


def iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def ticks(db: psycopg.Connection) -> dict[str, tuple[str, str | None]]:
    """Each ledgered tick instant: its outcome and execution."""
    rows = db.execute(
        "SELECT tick_at, outcome, execution_id::text FROM schedule_ticks ORDER BY id"
    ).fetchall()
    return {iso(at): (outcome, execution) for at, outcome, execution in rows}


def execution_row(db: psycopg.Connection, execution_id: str) -> tuple[str, str]:
    row = db.execute(
        "SELECT trigger, idempotency_key FROM executions WHERE id = %s", (execution_id,)
    ).fetchone()
    assert row is not None
    return row


def test_a_client_key_spelled_like_a_tick_neither_suppresses_nor_impersonates_it(
    client: Api, db: psycopg.Connection, workers: Callable[..., Process]
) -> None:
    client.publish("ticking", DEFINITION)
    shown = client.session.get(f"{client.base}/api/v1/workflows/ticking/schedule", timeout=10)
    upcoming = [t["tick_at"] for t in shown.json()["next"][:3]]
    # The sender pre-claims the next three ticks with the body each tick will carry,
    # through both headers an unsigned workflow takes its identity from.
    claimed: dict[str, str] = {}
    for n, tick in enumerate(upcoming):
        header = "Idempotency-Key" if n % 2 == 0 else "webhook-id"
        claimed[tick] = client.start(
            "ticking", {"scheduled_at": tick}, headers={header: f"schedule:{tick}"}
        )
    workers()
    wait_for(
        lambda: all(t in ticks(db) for t in upcoming),
        timeout=30,
        message="the three ticks to be decided",
    )
    ledger = ticks(db)
    for tick in upcoming:
        outcome, execution_id = ledger[tick]
        assert outcome == "fired", (tick, ledger[tick])
        assert execution_id is not None and execution_id != claimed[tick]
        assert execution_row(db, execution_id) == ("schedule", f"schedule:{tick}")
        # The sender's own key still answers the sender's own execution, never the tick's.
        again = client.hook(
            "ticking", {"scheduled_at": tick}, headers={"Idempotency-Key": f"schedule:{tick}"}
        )
        if tick == upcoming[1]:  # claimed through webhook-id: a new key for this header
            assert again.json()["execution_id"] != execution_id
        else:
            assert again.json()["execution_id"] == claimed[tick], again.text
        assert execution_row(db, claimed[tick])[0] == "webhook"


def test_backfill_dry_run_and_real_backfill_agree_over_pre_claimed_ticks(
    client: Api, db: psycopg.Connection
) -> None:
    client.publish("ticking", DEFINITION)
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(seconds=60 + now.second % EVERY_S)
    past = [start + timedelta(seconds=EVERY_S * n) for n in range(4)]
    for tick in past:
        client.start(
            "ticking",
            {"scheduled_at": iso(tick)},
            headers={"Idempotency-Key": f"schedule:{iso(tick)}"},
        )
    span = {"from": iso(past[0]), "to": iso(past[-1])}
    url = f"{client.base}/api/v1/workflows/ticking/schedule/backfill"
    dry = client.session.post(url, json={**span, "dry_run": True}, timeout=10)
    assert [i["outcome"] for i in dry.json()["items"]] == ["would fire"] * 4, dry.text
    real = client.session.post(url, json=span, timeout=10)
    items = real.json()["items"]
    assert [i["outcome"] for i in items] == ["fired"] * 4, real.text
    for item in items:
        assert execution_row(db, item["execution_id"]) == (
            "schedule",
            f"schedule:{item['tick_at']}",
        )
    after = client.session.post(url, json={**span, "dry_run": True}, timeout=10)
    assert [i["outcome"] for i in after.json()["items"]] == ["fired already"] * 4
    assert {i["execution_id"] for i in after.json()["items"]} == {i["execution_id"] for i in items}


def test_a_client_cannot_replay_its_way_to_a_ticks_execution(
    client: Api, db: psycopg.Connection
) -> None:
    client.publish("ticking", DEFINITION)
    fired = client.session.post(
        f"{client.base}/api/v1/workflows/ticking/schedule/trigger", timeout=10
    ).json()
    tick = fired["tick_at"]
    # The tick's own body and key: a new execution of the sender's, not a replay of the tick.
    r = requests.post(
        f"{client.base}/hooks/ticking",
        json={"scheduled_at": tick},
        headers={"Idempotency-Key": f"schedule:{tick}"},
        timeout=10,
    )
    assert r.status_code == 202, r.text
    assert r.json()["execution_id"] != fired["execution_id"]
    assert execution_row(db, r.json()["execution_id"])[0] == "webhook"


def test_a_client_key_spelled_like_a_childs_neither_blocks_nor_becomes_the_child(
    client: Api, db: psycopg.Connection, workers: Callable[..., Process]
) -> None:
    """A child's key is `child:<parent>:<step>:<fencing token>`: a sender who learned the
    parent's id (the 202 names it) claims every spelling of its first rounds before any
    worker runs; the parent still starts its own child, in the system's space."""
    client.publish(
        "child",
        {
            "name": "child",
            "trigger": {"webhook": {"auth": "none"}},
            "steps": [{"id": "keep", "type": "transform", "output": {"ok": True}}],
        },
    )
    client.publish(
        "parent",
        {
            "name": "parent",
            "trigger": {"webhook": {"auth": "none"}},
            "steps": [{"id": "invoke", "type": "workflow", "workflow": "child"}],
        },
    )
    parent_id = client.start("parent", {})
    planted = {
        client.start("child", {}, headers={"Idempotency-Key": f"child:{parent_id}:invoke:{n}"})
        for n in range(5)
    }
    workers()
    done = client.wait(parent_id, timeout=30)
    assert done["status"] == "succeeded", done
    [child] = done["children"]
    assert child["execution_id"] not in planted
    row = db.execute(
        "SELECT origin, key FROM idempotency_keys WHERE execution_id = %s",
        (child["execution_id"],),
    ).fetchone()
    assert row is not None and row[0] == "system" and row[1].startswith(f"child:{parent_id}:")
