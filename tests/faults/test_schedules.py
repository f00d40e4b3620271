"""Schedules (docs/contract.md#schedules) through real bin/api and bin/worker processes: a tick
fires once however many workers run and whichever is killed; the overlap policies with executions
that outlive two ticks; catch-up after every worker was stopped longer than the window."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg

from tests.integration.test_cli_remote import remote
from tests.support.api import TERMINAL, Api, step
from tests.support.processes import Process, wait_for
from tests.support.target import Received, Reply, Target

HOLD_S = 2.5  # how long each scheduled execution lives: more than two ticks


def scheduled(steps: list[dict[str, Any]], **schedule: Any) -> dict[str, Any]:
    return {
        "name": "scheduled",
        "trigger": {"webhook": {"auth": "none"}, "schedule": {"every_s": 1, **schedule}},
        "steps": steps,
    }


DELAY = [{"id": "work", "type": "delay", "duration_s": HOLD_S}]


def ledger(db: psycopg.Connection, key: str) -> list[tuple[datetime, str, str | None]]:
    return db.execute(
        "SELECT t.tick_at, t.outcome, t.execution_id::text FROM schedule_ticks t"
        " JOIN workflows w ON w.id = t.workflow_id WHERE w.key = %s ORDER BY t.id",
        (key,),
    ).fetchall()


def executions(db: psycopg.Connection, key: str) -> list[dict[str, Any]]:
    rows = db.execute(
        "SELECT e.id::text, e.status, e.stop_reason, e.input->>'scheduled_at',"
        " coalesce(e.slot_at, e.created_at),"
        " e.finished_at, e.trigger, e.idempotency_key FROM executions e"
        " JOIN workflows w ON w.id = e.workflow_id WHERE w.key = %s ORDER BY e.id",
        (key,),
    ).fetchall()
    names = (
        "id",
        "status",
        "stop_reason",
        "scheduled_at",
        "slot_at",
        "finished_at",
        "trigger",
        "key",
    )
    return [dict(zip(names, row, strict=True)) for row in rows]


def all_finished(db: psycopg.Connection) -> bool:
    row = db.execute(
        "SELECT count(*) FROM executions WHERE status <> ALL(%s)", (sorted(TERMINAL),)
    ).fetchone()
    return row is not None and row[0] == 0


def one_at_a_time(runs: list[dict[str, Any]]) -> bool:
    """Whether runs never overlapped: each started (took the slot) after the last ended."""
    held = sorted((r["slot_at"], r["finished_at"]) for r in runs)
    return all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(held))


def test_three_workers_fire_each_tick_once_through_a_sigkill_under_every_overlap_policy(
    client: Api, db: psycopg.Connection, target: Target, workers: Callable[..., Process]
) -> None:
    def slow(_received: Received) -> Reply:
        return Reply(json={"ok": True}, delay_s=HOLD_S)

    target.script = slow
    post = [
        {
            "id": "call",
            "type": "http_request",
            "request": {"method": "POST", "url": f"{target.url}/effect", "json": {"n": 1}},
        }
    ]
    procs = [workers() for _ in range(3)]
    client.publish("every", scheduled(DELAY, overlap="allow"))
    client.publish("skip", scheduled(DELAY, overlap="skip"))
    client.publish("buffer", scheduled(DELAY, overlap="buffer_one"))
    client.publish("cancel", scheduled(post, overlap="cancel_other"))
    time.sleep(7)
    procs[0].kill()
    time.sleep(9)
    for key in ("every", "skip", "buffer", "cancel"):
        assert client.post(f"/api/v1/workflows/{key}/schedule/pause").status_code == 200
    wait_for(lambda: all_finished(db), timeout=40, message="every execution to finish")

    # allow: one execution per tick instant, consecutive seconds, none missing, none twice.
    rows = [r for r in ledger(db, "every") if r[1] not in ("pause", "paused")]
    ticks = [r[0] for r in rows]
    assert len(ticks) >= 12
    assert ticks == [ticks[0] + timedelta(seconds=n) for n in range(len(ticks))]
    assert {r[1] for r in rows} == {"fired"}
    runs = executions(db, "every")
    assert sorted(r["id"] for r in runs) == sorted(r[2] for r in rows)
    assert sorted(r["scheduled_at"] for r in runs) == sorted(
        t.isoformat().replace("+00:00", "Z") for t in ticks
    )
    assert {(r["status"], r["trigger"]) for r in runs} == {("succeeded", "schedule")}
    assert all(r["key"] == f"schedule:{r['scheduled_at']}" for r in runs)
    assert not one_at_a_time(runs)  # allow overlaps

    # Every due tick of every schedule has exactly one ledger row.
    for key in ("skip", "buffer", "cancel"):
        instants = [r[0] for r in ledger(db, key) if r[1] not in ("pause",)]
        assert len(instants) == len(set(instants)), key
        assert instants == [instants[0] + timedelta(seconds=n) for n in range(len(instants))]

    # skip: skipped ticks while one is live, never two live.
    skip = ledger(db, "skip")
    assert {"fired", "skipped"} <= {r[1] for r in skip}
    assert one_at_a_time(executions(db, "skip"))

    # buffer_one: at most one waits; each buffered one ran after the live one, in turn.
    buffered = ledger(db, "buffer")
    assert {"fired", "buffered", "skipped"} <= {r[1] for r in buffered}
    buffer_runs = executions(db, "buffer")
    assert one_at_a_time(buffer_runs)
    assert {r["status"] for r in buffer_runs} == {"succeeded"}
    assert len(buffer_runs) == sum(r[1] in ("fired", "buffered") for r in buffered)

    # cancel_other: each tick cancels the live one; a POST in flight finishes and is kept.
    cancel_runs = executions(db, "cancel")
    cancelled = [r for r in cancel_runs if r["status"] == "cancelled"]
    assert len(cancelled) >= 3 and {r["stop_reason"] for r in cancelled} == {"concurrency"}
    kept = [step(client.execution(r["id"]), "call") for r in cancelled]
    posted = [s for s in kept if s["status"] == "succeeded"]
    assert posted, kept


def test_catch_up_after_every_worker_stopped_longer_than_the_window(
    client: Api, db: psycopg.Connection, workers: Callable[..., Process], api_key: str
) -> None:
    worker = workers()
    quick = [{"id": "a", "type": "transform", "output": 1}]
    client.publish("sweep", scheduled(quick, catchup_window_s=2, overlap="allow"))
    wait_for(lambda: len(ledger(db, "sweep")) >= 2, message="two ticks")
    worker.stop()
    stopped = time.monotonic()
    # Trigger now works without any worker: the API decides it.
    r = client.post("/api/v1/workflows/sweep/schedule/trigger")
    assert r.status_code == 201 and r.json()["outcome"] == "fired"
    while time.monotonic() - stopped < 6:
        time.sleep(0.2)
    workers()

    def fired_after_missed() -> bool:
        outcomes = [row[1] for row in ledger(db, "sweep")]
        return "missed" in outcomes and "fired" in outcomes[outcomes.index("missed") :]

    wait_for(fired_after_missed, message="ticks to fire again after the missed ones")
    # The remote CLI, through the API with the test's key.
    paused = remote(client.base, api_key, "schedule", "pause", "sweep")
    assert paused.returncode == 0 and "is paused" in paused.stdout, paused
    rows = [r for r in ledger(db, "sweep") if r[1] in ("fired", "missed")]
    outcomes = [r[1] for r in rows]
    # Before the stop: fired. Then the ticks older than 2 s: missed. Then fired again.
    first_missed = outcomes.index("missed")
    last_missed = len(outcomes) - 1 - outcomes[::-1].index("missed")
    assert set(outcomes[:first_missed]) == {"fired"}
    assert set(outcomes[first_missed : last_missed + 1]) == {"missed"}
    assert last_missed - first_missed + 1 >= 2
    assert set(outcomes[last_missed + 1 :]) == {"fired"}
    assert len(outcomes) > last_missed + 1
    shown = client.session.get(f"{client.base}/api/v1/workflows/sweep/schedule", timeout=10).json()
    assert shown["paused"]
    triggered = [t for t in shown["ledger"] if t["reason"] == "triggered by an operator"]
    assert len(triggered) == 1 and triggered[0]["actor"]["kind"] == "api_key"
    listed = remote(client.base, api_key, "schedule", "show", "sweep")
    assert listed.returncode == 0, listed
    assert "every 1 s in UTC, overlap allow, paused" in listed.stdout
    assert "missed" in listed.stdout and "api key" in listed.stdout
