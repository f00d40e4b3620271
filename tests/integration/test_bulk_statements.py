"""The set-based statements write only what the engine would: after each of them (the
intake's accept, the timer scanner's scan, the reconciler's re-dispatch) a `Run` loaded
from the database is one the engine agrees with — its derived status is the stored one,
and the history entries the SQL wrote are the ones the engine's transitions append."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from flowforge.domain.definitions import parse_definition
from flowforge.domain.engine import Run
from flowforge.domain.model import ExecutionStatus, Outcome, StepStatus, execution_event
from flowforge.store.db import one
from flowforge.store.runs import load_run, save_run, unit_of_work
from flowforge.usecases import intake, publishing
from flowforge.worker.reconciler import MAX_DOUBLINGS, REDISPATCH
from flowforge.worker.timers import WAKE_DUE, WAKE_PARAMS
from tests.support.definitions import http, workflow

# Two roots and a step after both: http steps only, so no step runs inside a transaction.
DOCUMENT = workflow(
    http("fetch", "GET", "http://127.0.0.1:9/fetch", retry={"max_attempts": 3}),
    http("other", "GET", "http://127.0.0.1:9/o"),
    http("after", "GET", "http://127.0.0.1:9/after", after=("fetch", "other")),
    name="bulk statements",
)
EVENTS_SINCE = """
SELECT step_id, kind, detail FROM execution_events
WHERE execution_id = %(id)s AND id > %(after)s ORDER BY id
"""
LAST_EVENT = "SELECT coalesce(max(id), 0) FROM execution_events WHERE execution_id = %(id)s"
OUTBOX = "SELECT step_id FROM outbox WHERE execution_id = %(id)s ORDER BY step_id"


@pytest.fixture
def execution(db: psycopg.Connection) -> Iterator[str]:
    """A new execution accepted by the intake statement."""
    publishing.publish(db, "bulk", DOCUMENT, parse_definition(DOCUMENT), None)
    target = intake.Targets().get(db, "bulk", None)
    yield intake.accept(db, target, json.dumps({"n": 1}).encode(), None, None).execution_id


def loaded(conn: psycopg.Connection, execution_id: str) -> Run:
    with unit_of_work(conn):
        run = load_run(conn, execution_id)
    assert run is not None
    return run


def assert_engine_agrees(run: Run) -> None:
    """Deriving the status from the loaded steps changes nothing: the SQL wrote it."""
    stored = run.status
    run.derive_status()
    assert (run.status, run.events) == (stored, [])


def events_since(conn: psycopg.Connection, execution_id: str, after: int) -> list[Any]:
    rows = conn.execute(EVENTS_SINCE, {"id": execution_id, "after": after}).fetchall()
    return [(step_id, kind, detail) for step_id, kind, detail in rows]


def test_intake_writes_what_the_engine_advances_to(db: psycopg.Connection, execution: str) -> None:
    run = loaded(db, execution)
    assert run.status == ExecutionStatus.QUEUED
    assert_engine_agrees(run)
    # The engine, from all-pending steps, promotes exactly the roots the intake made ready.
    fresh = loaded(db, execution)
    for state in fresh.steps.values():
        state.status = StepStatus.PENDING
    fresh.advance()
    assert {k: s.status for k, s in fresh.steps.items()} == {
        k: s.status for k, s in run.steps.items()
    }
    assert [row[0] for row in db.execute(OUTBOX, {"id": execution})] == sorted(fresh.dispatch)
    history = events_since(db, execution, 0)
    assert [kind for _, kind, _ in history] == [execution_event(ExecutionStatus.QUEUED)]
    assert history[0][2]["to"] == fresh.status == ExecutionStatus.QUEUED


def test_timer_scan_writes_the_engines_transitions(db: psycopg.Connection, execution: str) -> None:
    # Through the engine: both roots run, `fetch` fails and waits for a retry, `other`
    # succeeds; the execution is then `waiting`.
    with unit_of_work(db):
        run = load_run(db, execution)
        assert run is not None
        run.started()
        for sid in ("fetch", "other"):
            state = run.claim(sid, "test-worker")
            kind = "retry" if sid == "fetch" else "succeeded"
            run.record_outcome(sid, state.fencing_token, Outcome(kind, error="HTTP 503"))
        save_run(db, run.take_changes())
    assert run.status == ExecutionStatus.WAITING
    db.execute("UPDATE steps SET wake_at = now() - interval '1 second' WHERE status = 'waiting'")
    db.execute("DELETE FROM outbox")
    # What the engine would do when the wait is over.
    expected = loaded(db, execution)
    expected.set_step("fetch", StepStatus.READY)
    expected.derive_status()

    (before,) = one(db.execute(LAST_EVENT, {"id": execution}))
    with db.transaction():
        (woken, _lags) = one(db.execute(WAKE_DUE, {"limit": 10, **WAKE_PARAMS}))
    assert woken == 1

    after = loaded(db, execution)
    assert after.status == expected.status == ExecutionStatus.RUNNING
    assert {k: s.status for k, s in after.steps.items()} == {
        k: s.status for k, s in expected.steps.items()
    }
    assert_engine_agrees(after)
    assert events_since(db, execution, before) == expected.events
    assert [row[0] for row in db.execute(OUTBOX, {"id": execution})] == ["fetch"]


def test_reconciler_redispatches_only_what_the_engine_dispatches(
    db: psycopg.Connection, execution: str
) -> None:
    db.execute("DELETE FROM outbox")
    db.execute("UPDATE steps SET ready_at = now() - interval '1 hour' WHERE status = 'ready'")
    (before,) = one(db.execute(LAST_EVENT, {"id": execution}))
    with db.transaction():
        params = {"after_s": 1.0, "max_doublings": MAX_DOUBLINGS, "reached": None}
        (count, _) = one(db.execute(REDISPATCH, params))
    assert count == 2
    run = loaded(db, execution)
    assert_engine_agrees(run)
    ready = sorted(k for k, s in run.steps.items() if s.status == StepStatus.READY)
    assert [row[0] for row in db.execute(OUTBOX, {"id": execution})] == ready == ["fetch", "other"]
    assert events_since(db, execution, before) == []
