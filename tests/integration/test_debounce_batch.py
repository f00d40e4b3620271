"""Debounce and batch (docs/contract.md#debounce-batch) through the in-process API and the
scheduler's starter on a real PostgreSQL: events recorded against one group per key, a redelivery
not counted twice, a batch split at max_items, the started execution's input and what it was built
from, flow control on the started executions, and the definition's 422s."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from flowforge.usecases import grouping
from flowforge.worker.housekeeping import Housekeeping
from flowforge.worker.retention import EXPIRE_FAILED_GROUPS
from tests.support import inprocess

STEPS = [{"id": "shape", "type": "transform", "output": {"n": 1}}]


def grouped(kind: str, **options: Any) -> dict[str, Any]:
    return {"name": kind, "trigger": {"webhook": {"auth": "none", kind: options}}, "steps": STEPS}


def publish(client: Any, key: str, definition: dict[str, Any]) -> None:
    r = client.post(f"/api/v1/workflows/{key}/versions", json=definition)
    assert r.status_code == 201, r.get_json()


def start_all(db: psycopg.Connection) -> list[grouping.Started]:
    """Run the scheduler's part until no group is due."""
    starter = grouping.Starter()
    started = []
    while (one := starter.start_one(db)) is not None:
        started.append(one)
    return started


def wait_due(db: psycopg.Connection) -> None:
    """Sleep until every open group is due (by the database's clock)."""
    while (left := grouping.next_due(db)) is not None and left > 0:
        time.sleep(left + 0.05)


def executions(db: psycopg.Connection, key: str) -> list[tuple[str, Any, str]]:
    return db.execute(
        "SELECT e.id::text, e.input, e.status FROM executions e JOIN workflows w"
        " ON w.id = e.workflow_id WHERE w.key = %s ORDER BY e.id",
        (key,),
    ).fetchall()


def test_debounce_records_every_event_against_one_execution_per_key(
    open_client: Any, db: psycopg.Connection
) -> None:
    c = open_client
    definition = grouped("debounce", key="{{ input.customer }}", window_s=1, max_wait_s=30)
    publish(c, "deb", definition)
    answers = []
    for n in range(5):
        r = c.post(
            "/hooks/deb", json={"customer": "a", "n": n}, headers={"Idempotency-Key": f"a{n}"}
        )
        assert r.status_code == 202, r.get_json()
        answers.append(r.get_json())
    b = c.post("/hooks/deb", json={"customer": "b", "n": 0}).get_json()
    # Every event of key a names the same execution and group; b has its own.
    assert {a["execution_id"] for a in answers} == {answers[0]["execution_id"]}
    assert [a["group"]["events"] for a in answers] == [1, 2, 3, 4, 5]
    assert {a["status"] for a in answers} == {"grouped"}
    assert b["execution_id"] != answers[0]["execution_id"] and b["group"]["key"] == "b"
    # A redelivery is a replay, counted once; the same key with another body is a 409.
    again = c.post("/hooks/deb", json={"customer": "a", "n": 2}, headers={"Idempotency-Key": "a2"})
    assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["execution_id"] == answers[0]["execution_id"]
    other = c.post("/hooks/deb", json={"customer": "a", "n": 9}, headers={"Idempotency-Key": "a2"})
    assert other.status_code == 409
    listed = c.get("/api/v1/workflows/deb/groups?status=open").get_json()["items"]
    assert sorted((g["key"], g["events"]) for g in listed) == [("a", 5), ("b", 1)]
    detail = c.get(f"/api/v1/workflows/deb/groups/{answers[0]['group']['id']}").get_json()
    assert detail["status"] == "open" and [e["body"]["n"] for e in detail["event_list"]] == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert c.get("/api/v1/workflows/deb/groups/999999").status_code == 404
    assert c.get("/api/v1/workflows/deb/groups?status=nope").status_code == 400
    # Nothing started before the window is quiet.
    assert start_all(db) == [] and executions(db, "deb") == []
    wait_due(db)
    started = start_all(db)
    assert sorted((s.outcome, s.events) for s in started) == [("started", 1), ("started", 5)]
    runs = {row[0]: row for row in executions(db, "deb")}
    assert set(runs) == {answers[0]["execution_id"], b["execution_id"]}
    assert runs[answers[0]["execution_id"]][1] == {"customer": "a", "n": 4, "debounced": 4}
    assert runs[b["execution_id"]][1] == {"customer": "b", "n": 0, "debounced": 0}
    shown = c.get(f"/api/v1/executions/{answers[0]['execution_id']}").get_json()
    built = shown["built_from"]
    assert built["kind"] == "debounce" and built["status"] == "started"
    assert [e["body"]["n"] for e in built["event_list"]] == [0, 1, 2, 3, 4]
    assert [e["idempotency_key"] for e in built["event_list"]] == [f"a{n}" for n in range(5)]
    # The replay after the start still names the execution; the next event opens a group.
    later = c.post("/hooks/deb", json={"customer": "a", "n": 2}, headers={"Idempotency-Key": "a2"})
    assert later.get_json()["execution_id"] == answers[0]["execution_id"]
    fresh = c.post("/hooks/deb", json={"customer": "a", "n": 5}).get_json()
    assert fresh["execution_id"] not in runs and fresh["group"]["events"] == 1
    # A debounced execution gets an object: anything else is a 422, nothing recorded.
    assert c.post("/hooks/deb", json=[1, 2]).status_code == 422
    assert c.post("/hooks/deb", json={"n": 1}).status_code == 422  # key does not render


def test_max_wait_bounds_a_busy_debounce(open_client: Any, db: psycopg.Connection) -> None:
    c = open_client
    definition = grouped("debounce", window_s=1, max_wait_s=2)
    publish(c, "busy", definition)
    first = c.post("/hooks/busy", json={"n": 0}).get_json()
    ends = time.monotonic() + 3.5
    n = 0
    ids = {first["execution_id"]}
    while time.monotonic() < ends:  # never a quiet second: only max_wait ends the group
        n += 1
        ids.add(c.post("/hooks/busy", json={"n": n}).get_json()["execution_id"])
        start_all(db)
        time.sleep(0.2)
    wait_due(db)
    start_all(db)
    runs = executions(db, "busy")
    assert len(runs) == len(ids) >= 2
    assert (
        sorted(r[1]["debounced"] + 1 for r in runs)
        and sum(r[1]["debounced"] + 1 for r in runs) == n + 1
    )


def test_batch_splits_at_max_items_and_delivers_events_in_order(
    open_client: Any, db: psycopg.Connection
) -> None:
    c = open_client
    publish(c, "bat", grouped("batch", max_items=3, window_s=1))
    answers = [c.post("/hooks/bat", json={"n": n}).get_json() for n in range(7)]
    ids = [a["execution_id"] for a in answers]
    assert ids[0:3] == [ids[0]] * 3 and ids[3:6] == [ids[3]] * 3 and len(set(ids)) == 3
    assert [a["group"]["status"] for a in answers[:3]] == ["open", "open", "closed"]
    # Full batches start at once; the last one after its window.
    assert [s.events for s in start_all(db)] == [3, 3]
    wait_due(db)
    assert [s.events for s in start_all(db)] == [1]
    inputs = {row[0]: row[1] for row in executions(db, "bat")}
    assert [e["n"] for e in inputs[ids[0]]["events"]] == [0, 1, 2]
    assert [e["n"] for e in inputs[ids[3]]["events"]] == [3, 4, 5]
    assert inputs[ids[6]] == {"events": [{"n": 6}]}


def test_flow_control_applies_to_started_groups(open_client: Any, db: psycopg.Connection) -> None:
    c = open_client
    definition = {
        **grouped("batch", key="{{ input.k }}", max_items=1, window_s=1),
        "concurrency": {"limit": 1, "max_queued": 1},
    }
    publish(c, "fc", definition)
    ids = [c.post("/hooks/fc", json={"k": str(n)}).get_json()["execution_id"] for n in range(3)]
    outcomes = [s.outcome for s in start_all(db)]
    # One holds the slot, one queues; the third is deferred, not lost.
    assert sorted(outcomes) == ["deferred", "started", "started"]
    deferred = [
        g
        for g in c.get("/api/v1/workflows/fc/groups").get_json()["items"]
        if g["status"] == "closed"
    ]
    assert len(deferred) == 1 and "max_queued" in deferred[0]["reason"]
    assert deferred[0]["execution_id"] in ids
    assert len(executions(db, "fc")) == 2


@pytest.mark.parametrize(
    ("webhook", "path"),
    [
        ({"debounce": {"window_s": 0.5}}, "$.trigger.webhook.debounce.window_s"),
        ({"debounce": {"window_s": 86401}}, "$.trigger.webhook.debounce.window_s"),
        ({"debounce": {"window_s": 10, "max_wait_s": 5}}, "$.trigger.webhook.debounce.max_wait_s"),
        (
            {"debounce": {"window_s": 10, "max_wait_s": 604801}},
            "$.trigger.webhook.debounce.max_wait_s",
        ),
        ({"debounce": {"window_s": 1, "key": "{{ secrets.x }}"}}, "$.trigger.webhook.debounce.key"),
        ({"debounce": {"window_s": 1, "extra": 1}}, "$.trigger.webhook.debounce.extra"),
        ({"debounce": 5}, "$.trigger.webhook.debounce"),
        ({"batch": {"window_s": 1}}, "$.trigger.webhook.batch.max_items"),
        ({"batch": {"window_s": 1, "max_items": 1001}}, "$.trigger.webhook.batch.max_items"),
        ({"batch": {"window_s": 1, "max_items": 0}}, "$.trigger.webhook.batch.max_items"),
        ({"batch": {"max_items": 2}}, "$.trigger.webhook.batch.window_s"),
        (
            {"batch": {"window_s": 1, "max_items": 2}, "debounce": {"window_s": 1}},
            "$.trigger.webhook.batch",
        ),
    ],
)
def test_bounds_are_422_with_the_path(open_client: Any, webhook: dict[str, Any], path: str) -> None:
    definition = {"name": "x", "trigger": {"webhook": {"auth": "none", **webhook}}, "steps": STEPS}
    r = open_client.post("/api/v1/workflows/bad/versions", json=definition)
    assert r.status_code == 422, r.get_json()
    assert path in [e["path"] for e in r.get_json()["errors"]], r.get_json()


def test_the_console_shows_open_groups_and_what_an_execution_was_built_from(
    open_client: Any, db: psycopg.Connection, api_key: str
) -> None:
    from tests.integration.test_console import _sign_in

    c = open_client
    definition = grouped("batch", key="{{ input.shop }}", max_items=2, window_s=60)
    publish(c, "ui", definition)
    full = [
        c.post("/hooks/ui", json={"shop": "s1", "n": n}, headers={"Idempotency-Key": f"k{n}"})
        for n in range(2)
    ]
    waiting = c.post("/hooks/ui", json={"shop": "s2", "n": 9}).get_json()
    start_all(db)
    c.environ_base.pop("HTTP_AUTHORIZATION")
    _sign_in(c, api_key)
    page = c.get("/ui/workflows/ui").get_data(as_text=True)
    assert 'id="intake-groups"' in page
    assert waiting["execution_id"] in page and ">s2<" in page and ">open" in page
    started = full[0].get_json()["execution_id"]
    assert f'href="/ui/executions/{started}"' in page
    detail = c.get(f"/ui/executions/{started}").get_data(as_text=True)
    assert 'id="built-from-events"' in detail and "Built from batch group" in detail
    assert ">k0<" in detail and ">k1<" in detail


def test_a_source_routes_into_a_debounced_workflow_beside_a_plain_one(
    open_client: Any, db: psycopg.Connection
) -> None:
    c = open_client
    definition = grouped("debounce", key="{{ input.customer }}", window_s=1)
    publish(c, "quiet", definition)
    source = {"auth": "none", "subscriptions": [{"workflow": "quiet"}, {"workflow": "open"}]}
    assert c.post("/api/v1/sources/feed", json=source).status_code == 200, "source"
    answers = [
        c.post("/hooks/feed", json={"customer": "z", "x": n}, headers={"Idempotency-Key": f"f{n}"})
        for n in range(3)
    ]
    assert {r.status_code for r in answers} == {202}
    routed = [{e["workflow"]: e for e in r.get_json()["executions"]} for r in answers]
    # The plain subscription starts one execution per event; the debounced one groups.
    assert len({r["open"]["execution_id"] for r in routed}) == 3
    assert {r["quiet"]["execution_id"] for r in routed} == {routed[0]["quiet"]["execution_id"]}
    assert [r["quiet"]["group"]["events"] for r in routed] == [1, 2, 3]
    again = c.post("/hooks/feed", json={"customer": "z", "x": 1}, headers={"Idempotency-Key": "f1"})
    assert again.get_json()["executions"][0]["replayed"] is True
    wait_due(db)
    assert [s.events for s in start_all(db)] == [3]
    (data,) = [row[1] for row in executions(db, "quiet")]
    assert data == {"customer": "z", "x": 2, "debounced": 2}


def test_deleting_a_started_execution_deletes_its_group_and_events(
    open_client: Any, db: psycopg.Connection
) -> None:
    """Retention deletes executions (worker/retention.py); their groups go with them."""
    c = open_client
    publish(c, "gone", grouped("batch", max_items=2, window_s=60))
    ids = {c.post("/hooks/gone", json={"n": n}).get_json()["execution_id"] for n in range(3)}
    start_all(db)
    started = [
        g
        for g in c.get("/api/v1/workflows/gone/groups").get_json()["items"]
        if g["status"] == "started"
    ]
    assert len(started) == 1 and len(ids) == 2
    db.execute("DELETE FROM executions WHERE id = %s", (started[0]["execution_id"],))
    left = db.execute("SELECT status, events FROM intake_groups").fetchall()
    assert left == [("open", 1)]
    assert db.execute("SELECT count(*) FROM intake_group_events").fetchone() == (1,)


def test_the_cli_lists_a_workflows_groups_on_the_box(open_client: Any, database_url: str) -> None:
    from tests.integration.test_api_keys import cli

    definition = grouped("debounce", key="{{ input.customer }}", window_s=60)
    publish(open_client, "cli", definition)
    accepted = open_client.post("/hooks/cli", json={"customer": "c7"}).get_json()
    done = cli(database_url, "--db", "workflow", "groups", "cli", "--status", "open")
    assert done.returncode == 0, done.stderr
    assert "c7" in done.stdout and accepted["execution_id"] in done.stdout
    assert "debounce" in done.stdout and "open" in done.stdout
    missing = cli(database_url, "--db", "workflow", "groups", "nope")
    assert missing.returncode == 1, missing


def test_a_group_whose_concurrency_key_cannot_render_fails_with_the_reason(
    open_client: Any, db: psycopg.Connection
) -> None:
    c = open_client
    definition = {
        **grouped("batch", max_items=1, window_s=1),
        "concurrency": {"limit": 1, "key": "{{ input.customer }}"},  # the input is {events}
    }
    publish(c, "nokey", definition)
    assert c.post("/hooks/nokey", json={"customer": "x"}).status_code == 202
    assert [s.outcome for s in start_all(db)] == ["failed"]
    (shown,) = c.get("/api/v1/workflows/nokey/groups").get_json()["items"]
    assert shown["status"] == "failed" and "concurrency key" in shown["reason"]
    assert executions(db, "nokey") == []


def test_failed_groups_are_deleted_with_their_events_after_retention(
    open_client: Any, db: psycopg.Connection, database_url: str
) -> None:
    """A group that can never start (its workflow archived while it was open, a concurrency
    key that does not render) is kept retention_days after it failed, and at least as long
    as its events' idempotency keys, then deleted with its events (worker/retention.py)."""
    c = open_client
    debounced = grouped("debounce", key="{{ input.customer }}", window_s=60)
    publish(c, "arch", debounced)
    short = {
        **grouped("batch", max_items=1, window_s=1),
        "concurrency": {"limit": 1, "key": "{{ input.customer }}"},  # the input is {events}
        "retention_days": 0.001,
    }
    publish(c, "short", short)
    for n in range(2):
        headers = {"Idempotency-Key": f"k{n}"}
        assert c.post("/hooks/arch", json={"customer": "a"}, headers=headers).status_code == 202
    assert c.post("/hooks/short", json={"customer": "x"}).status_code == 202
    # The workflow is archived while its group is open; the group is due by its max wait.
    db.execute("UPDATE workflows SET archived_at = now() WHERE key = 'arch'")
    db.execute("UPDATE intake_groups SET due_at = now() WHERE status = 'open'")
    outcomes = sorted((s.workflow, s.outcome) for s in start_all(db))
    assert outcomes == [("arch", "failed"), ("short", "failed")]

    def left() -> dict[str, int]:
        rows = db.execute(
            "SELECT w.key, count(e.id) FROM intake_groups g JOIN workflows w"
            " ON w.id = g.workflow_id LEFT JOIN intake_group_events e ON e.group_id = g.id"
            " GROUP BY w.key"
        ).fetchall()
        return dict(rows)

    def aged(key: str, age: str) -> None:
        db.execute(
            "UPDATE intake_groups SET started_at = now() - %s::interval"
            " WHERE workflow_id = (SELECT id FROM workflows WHERE key = %s)",
            (age, key),
        )

    with inprocess.pool(database_url, "test-groups-retention") as pool:
        housekeeping = Housekeeping(pool, threading.Event())
        # Within retention_days (arch: the default 30) or the key lifetime (short: 24 h).
        aged("arch", "29 days")
        aged("short", "2 hours")
        housekeeping.housekeep()
        assert left() == {"arch": 2, "short": 1}
        aged("arch", "31 days")
        aged("short", "25 hours")
        housekeeping.housekeep()
        assert left() == {}
        assert housekeeping.retention.expire_groups() == (0, True)
    assert db.execute("SELECT count(*) FROM intake_group_events").fetchone() == (0,)


def test_a_group_cannot_outlive_its_workflow_row(db: psycopg.Connection) -> None:
    """The scheduler claims groups through their workflow: one without it would stay due
    forever. A group needs its workflow, and deleting the workflow deletes its groups."""
    insert = (
        "INSERT INTO intake_groups (workflow_id, kind, group_key, execution_id, due_at,"
        " deadline_at) VALUES (%s, 'batch', '', gen_random_uuid(), now(), now())"
    )
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        db.execute(insert, (-1,))
    (workflow_id,) = db.execute(
        "INSERT INTO workflows (key) VALUES ('bare') RETURNING id"
    ).fetchone()
    db.execute(insert, (workflow_id,))
    db.execute("DELETE FROM workflows WHERE id = %s", (workflow_id,))
    assert db.execute("SELECT count(*) FROM intake_groups").fetchone() == (0,)


def test_finding_failed_groups_goes_through_their_partial_index(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO workflows (key, latest_version) VALUES ('w', 1)")
    db.execute(
        "INSERT INTO workflow_versions (workflow_id, version, name, definition, webhook_auth) "
        "SELECT id, 1, 'w', '{}', 'none' FROM workflows"
    )
    db.execute("SET enable_seqscan = off")
    params = {"limit": 500, "default_days": 30, "key_hours": 24}
    plan = "\n".join(row[0] for row in db.execute("EXPLAIN " + EXPIRE_FAILED_GROUPS, params))
    assert "intake_groups_failed on intake_groups" in plan, plan
    assert "Seq Scan on intake_groups" not in plan, plan
