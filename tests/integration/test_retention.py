"""Retention deletes exactly the finished executions it should, with every child row
(docs/contract.md#retention), against the real database: executions made by the real intake, then
left the way the worker leaves them (finished, needs_attention, an unknown step under a
cancelled execution ...) with their finish moved into the past; and once through real
bin/worker processes, where the housekeeping loop does it on its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import psycopg_pool
import pytest

from flowforge.worker.housekeeping import Housekeeping
from flowforge.worker.retention import EXPIRE_KEYED, EXPIRE_UNKEYED, Retention
from tests.support import inprocess
from tests.support.definitions import unsigned
from tests.support.processes import Process, wait_for

STEPS = [
    {"id": "a", "type": "transform", "output": {"x": "{{ input.x }}"}},
    {"id": "b", "type": "transform", "depends_on": ["a"], "output": {"y": "{{ a.x }}"}},
]
# Kept for 86.4 seconds; the other workflow keeps the default 30 days.
SHORT_DAYS = 0.001
CHILD_TABLES = ("steps", "attempts", "execution_events", "resumes")
# As the worker leaves a finished execution: steps settled, an attempt, a resume, history.
FINISH = """
WITH e AS (
    UPDATE executions SET status = %(status)s, started_at = now() - %(age)s::interval,
                          finished_at = now() - %(age)s::interval
    WHERE id = %(id)s
), s AS (
    UPDATE steps SET status = %(step)s WHERE execution_id = %(id)s
), a AS (
    INSERT INTO attempts (execution_id, step_id, attempt, fencing_token, outcome)
    VALUES (%(id)s, 'a', 1, 1, 'succeeded')
), r AS (
    INSERT INTO resumes (execution_id, step_id, body_sha256, body)
    VALUES (%(id)s, 'b', '\\x00', '{}')
)
INSERT INTO execution_events (execution_id, kind) VALUES (%(id)s, 'execution.' || %(status)s)
"""


@pytest.fixture
def pool(database_url: str) -> Iterator[psycopg_pool.ConnectionPool]:
    with inprocess.pool(database_url, "test-retention", max_size=4) as made:
        yield made


def publish(client: Any, key: str, **options: Any) -> None:
    response = client.post(f"/api/v1/workflows/{key}/versions", json={**unsigned(STEPS), **options})
    assert response.status_code == 201, response.get_json()


def hook(client: Any, key: str, idempotency_key: str | None = None) -> tuple[str, bool]:
    """One webhook; returns the execution id and whether it was a replay."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    response = client.post(
        f"/hooks/{key}", data=b'{"x": 1}', headers=headers, content_type="application/json"
    )
    assert response.status_code == 202, response.get_json()
    replayed = response.headers.get("Idempotent-Replayed") == "true"
    return response.get_json()["execution_id"], replayed


def finish(
    db: psycopg.Connection, eid: str, status: str, age: str, step: str = "succeeded"
) -> None:
    db.execute(FINISH, {"id": eid, "status": status, "age": age, "step": step})


def existing(db: psycopg.Connection, ids: list[str]) -> set[str]:
    rows = db.execute("SELECT id::text FROM executions WHERE id = ANY(%s::uuid[])", (ids,))
    return {row[0] for row in rows}


def children(db: psycopg.Connection, ids: list[str] | set[str]) -> dict[str, int]:
    return {
        table: db.execute(
            f"SELECT count(*) FROM {table} WHERE execution_id = ANY(%s::uuid[])", (list(ids),)
        ).fetchone()[0]
        for table in CHILD_TABLES
    }


def test_retention_deletes_exactly_the_expired_finished_executions_and_their_rows(
    open_client: Any, db: psycopg.Connection, pool: psycopg_pool.ConnectionPool
) -> None:
    # Executions pinned to a version with the default retention are still governed by
    # the newest version's value once it is published.
    publish(open_client, "short")
    pinned_to_v1, _ = hook(open_client, "short")
    publish(open_client, "short", retention_days=SHORT_DAYS)
    publish(open_client, "long")

    doomed = [pinned_to_v1]
    finish(db, pinned_to_v1, "succeeded", "1 hour")
    for status in ("succeeded", "failed", "cancelled"):
        eid, _ = hook(open_client, "short")
        finish(db, eid, status, "1 hour")
        doomed.append(eid)
    # The other workflow's default: 30 days.
    ancient, _ = hook(open_client, "long")
    finish(db, ancient, "succeeded", "31 days")
    doomed.append(ancient)
    # A key forgotten by housekeeping, its execution finished more than a day ago.
    forgotten, _ = hook(open_client, "short", "forgotten-key")
    finish(db, forgotten, "succeeded", "25 hours")
    db.execute("DELETE FROM idempotency_keys WHERE key = 'forgotten-key'")
    doomed.append(forgotten)

    kept: dict[str, str] = {}
    young, _ = hook(open_client, "short")
    finish(db, young, "succeeded", "0 seconds")
    kept[young] = "finished within its retention"
    other, _ = hook(open_client, "long")
    finish(db, other, "succeeded", "1 hour")
    kept[other] = "another workflow, which keeps 30 days"
    attention, _ = hook(open_client, "short")
    finish(db, attention, "needs_attention", "1 hour", step="unknown")
    kept[attention] = "needs_attention"
    unknown, _ = hook(open_client, "short")
    finish(db, unknown, "cancelled", "1 hour")
    db.execute(
        "UPDATE steps SET status = 'unknown' WHERE execution_id = %s AND step_id = 'b'", (unknown,)
    )
    kept[unknown] = "an unknown step under a cancelled execution"
    for status in ("queued", "running", "waiting"):
        live, _ = hook(open_client, "short")
        db.execute(
            "UPDATE executions SET status = %s, created_at = now() - interval '1 hour' "
            "WHERE id = %s",
            (status, live),
        )
        kept[live] = f"live ({status})"
    keyed, _ = hook(open_client, "short", "live-key")
    finish(db, keyed, "succeeded", "25 hours")
    kept[keyed] = "its idempotency key is still remembered"
    recent_key, _ = hook(open_client, "short", "recent-key")
    finish(db, recent_key, "succeeded", "1 hour")
    db.execute("DELETE FROM idempotency_keys WHERE key = 'recent-key'")
    kept[recent_key] = "a keyed execution younger than a day"

    before = children(db, kept)
    deleted, caught_up = Retention(pool, threading.Event()).expire()

    assert (deleted, caught_up) == (len(doomed), True)
    assert existing(db, doomed) == set()
    assert children(db, doomed) == dict.fromkeys(CHILD_TABLES, 0)
    gone = set(kept) - existing(db, list(kept))
    assert [kept[eid] for eid in gone] == []
    assert children(db, kept) == before
    assert Retention(pool, threading.Event()).expire() == (0, True)


def test_batches_are_bounded_and_a_locked_execution_is_skipped_not_waited_for(
    open_client: Any, db: psycopg.Connection, pool: psycopg_pool.ConnectionPool
) -> None:
    publish(open_client, "short", retention_days=SHORT_DAYS)
    ids = [hook(open_client, "short")[0] for _ in range(7)]
    for eid in ids:
        finish(db, eid, "succeeded", "1 hour")
    keyed, _ = hook(open_client, "short", "k")
    finish(db, keyed, "succeeded", "25 hours")
    db.execute("DELETE FROM idempotency_keys")

    # No time budget: exactly one batch of each kind per call.
    retention = Retention(pool, threading.Event(), batch=3, budget_s=0.0)
    assert retention.expire() == (3 + 1, False)
    assert len(existing(db, ids)) == 4

    # Another worker (or an operator) holds one of them: it is skipped, the rest go.
    with psycopg.connect(db.info.dsn) as other, other.transaction():
        other.execute("SELECT 1 FROM executions WHERE id = %s FOR UPDATE", (ids[-1],))
        while not retention.expire()[1]:
            pass
        assert existing(db, ids) == {ids[-1]}
    assert retention.expire() == (1, True)


def test_a_duplicate_webhook_is_answered_with_the_original_until_its_key_is_forgotten(
    open_client: Any, db: psycopg.Connection, pool: psycopg_pool.ConnectionPool
) -> None:
    publish(open_client, "short", retention_days=SHORT_DAYS)
    original, _ = hook(open_client, "short", "delivery-1")
    finish(db, original, "succeeded", "25 hours")
    housekeeping = Housekeeping(pool, threading.Event())

    # Past its retention, but the key is remembered for 24 hours by default: kept, and a
    # duplicate still gets the original execution, which can still be read.
    assert housekeeping.housekeep() == (0, True)
    assert existing(db, [original]) == {original}
    assert hook(open_client, "short", "delivery-1") == (original, True)
    assert open_client.get(f"/api/v1/executions/{original}").status_code == 200

    # Once the key expired, housekeeping forgets it and then deletes the execution in the
    # same pass; the same delivery now starts a new execution, as after any 24 hours.
    db.execute("UPDATE idempotency_keys SET created_at = now() - interval '25 hours'")
    assert housekeeping.housekeep() == (1, True)
    assert existing(db, [original]) == set()
    again, replayed = hook(open_client, "short", "delivery-1")
    assert (again != original, replayed) == (True, False)


@pytest.mark.parametrize(
    ("statement", "index"),
    [(EXPIRE_UNKEYED, "executions_finished"), (EXPIRE_KEYED, "executions_finished_keyed")],
)
def test_finding_candidates_goes_through_the_partial_indexes(
    db: psycopg.Connection, statement: str, index: str
) -> None:
    db.execute("INSERT INTO workflows (key, latest_version) VALUES ('w', 1)")
    db.execute(
        "INSERT INTO workflow_versions (workflow_id, version, name, definition, webhook_auth) "
        "SELECT id, 1, 'w', '{}', 'none' FROM workflows"
    )
    db.execute("SET enable_seqscan = off")
    plan = "\n".join(
        row[0]
        for row in db.execute(
            "EXPLAIN " + statement, {"limit": 500, "default_days": 30, "key_hours": 24}
        )
    )
    assert f"Index Scan using {index} on executions" in plan, plan
    assert "steps_unknown" in plan, plan
    assert "Seq Scan on executions" not in plan, plan
    assert "Seq Scan on steps" not in plan, plan
    if index.endswith("keyed"):
        assert "idempotency_keys_pkey" in plan, plan


def test_a_worker_process_deletes_expired_executions_on_its_own(
    open_client: Any, db: psycopg.Connection, workers: Callable[..., Process]
) -> None:
    publish(open_client, "short", retention_days=0.00001)  # under a second
    publish(open_client, "long")
    short = [hook(open_client, "short")[0] for _ in range(5)]
    long, _ = hook(open_client, "long")

    def finished() -> bool:
        row = db.execute("SELECT count(*) FROM executions WHERE status = 'succeeded'").fetchone()
        return row[0] == 6

    # The first worker runs them; its first housekeeping pass came before they finished,
    # and the next is a minute away. A second worker's first pass deletes them.
    first = workers()
    wait_for(finished, timeout=30, message="the executions to succeed")
    first.stop()
    wait_for(
        lambda: db.execute(
            "SELECT bool_and(finished_at < now() - interval '1 second') FROM executions"
        ).fetchone()[0],
        message="a second to pass since they finished",
    )
    second = workers()
    wait_for(lambda: not existing(db, short), timeout=30, message="retention to delete them")
    assert existing(db, [long]) == {long}
    assert children(db, short) == dict.fromkeys(CHILD_TABLES, 0)
    assert "deleted executions past their retention" in second.log()


def test_a_bad_retention_is_a_422_naming_its_path_and_publishes_nothing(
    open_client: Any, db: psycopg.Connection
) -> None:
    response = open_client.post(
        "/api/v1/workflows/short/versions", json={**unsigned(STEPS), "retention_days": 0}
    )
    assert response.status_code == 422
    assert response.content_type == "application/problem+json"
    assert [e["path"] for e in response.get_json()["errors"]] == ["$.retention_days"]
    assert db.execute("SELECT count(*) FROM workflows WHERE key = 'short'").fetchone() == (0,)


def test_a_worker_keeps_idempotency_keys_as_long_as_configured_then_forgets_them(
    open_client: Any, db: psycopg.Connection, workers: Callable[..., Process]
) -> None:
    """FLOWFORGE_IDEMPOTENCY_KEY_HOURS at its floor, 1 hour, on a real bin/worker; the
    keys' ages are moved into the past (90 and 30 minutes), as retention's tests do."""
    publish(open_client, "short", retention_days=SHORT_DAYS)
    expired, _ = hook(open_client, "short", "delivery-1")
    live, _ = hook(open_client, "short", "delivery-2")
    for eid, key, age in (
        (expired, "delivery-1", "90 minutes"),
        (live, "delivery-2", "30 minutes"),
    ):
        finish(db, eid, "succeeded", age)  # both past their workflow's retention of 86 s
        db.execute(
            "UPDATE idempotency_keys SET created_at = now() - %s::interval WHERE key = %s",
            (age, key),
        )

    # Housekeeping's first pass, at start: the hour-old key is forgotten (with the default
    # 24 hours it would be kept), then its execution goes; the younger one stays.
    worker = workers(FLOWFORGE_IDEMPOTENCY_KEY_HOURS="1")
    wait_for(lambda: not existing(db, [expired]), timeout=30, message="retention to delete it")
    assert "forgot old idempotency keys" in worker.log()
    keys = db.execute("SELECT key FROM idempotency_keys").fetchall()
    assert keys == [("delivery-2",)]
    assert existing(db, [live]) == {live}

    # Before expiry a duplicate gets the original; after it, the same delivery is new.
    assert hook(open_client, "short", "delivery-2") == (live, True)
    again, replayed = hook(open_client, "short", "delivery-1")
    assert (again != expired, replayed) == (True, False)
