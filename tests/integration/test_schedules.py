"""Schedules (docs/contract.md#schedules) in process against a real database: the scheduler's pass
(Ticker.decide_due) and the API's schedule endpoints through the Flask app.

Downtime is the state it leaves: a schedule row whose next tick lies in the past. Tests
put a row in that state with one UPDATE instead of waiting for it (the real-process tests
in tests/faults/test_schedules.py stop real workers instead).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from flowforge import cli
from flowforge.store import apikeys, schedules
from flowforge.usecases import intake
from flowforge.usecases.ticks import Candidate, Ticker, fire_batch
from tests.support.processes import wait_for

STEP = [{"id": "shape", "type": "transform", "output": {"at": "{{ input.scheduled_at }}"}}]


def scheduled(schedule: dict[str, Any], webhook: bool = True) -> dict[str, Any]:
    trigger: dict[str, Any] = {"schedule": schedule}
    if webhook:
        trigger["webhook"] = {"auth": "none"}
    return {"name": "scheduled", "trigger": trigger, "steps": STEP}


@pytest.fixture
def client(app_client: Any, api_key: str) -> Any:
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    return app_client


def publish(client: Any, key: str, definition: dict[str, Any]) -> None:
    r = client.post(f"/api/v1/workflows/{key}/versions", json=definition)
    assert r.status_code == 201, r.get_json()


# Every schedule's next tick: the coming whole second (one instant for all of them).
NEXT_SECOND = (
    "UPDATE schedules SET next_tick_at = date_trunc('second', now()) + interval '1 second',"
    " fire_at = date_trunc('second', now()) + interval '1 second'"
)


def rewind(db: psycopg.Connection, key: str, seconds: float) -> datetime:
    """Put the schedule's next tick `seconds` into the past, as downtime leaves it."""
    row = db.execute(
        "UPDATE schedules s SET next_tick_at = date_trunc('second', now())"
        " - make_interval(secs => %s), fire_at = date_trunc('second', now())"
        " - make_interval(secs => %s)"
        " FROM workflows w WHERE w.id = s.workflow_id AND w.key = %s RETURNING next_tick_at",
        (seconds, seconds, key),
    ).fetchone()
    assert row is not None
    return row[0]


def decide_all(db: psycopg.Connection, ticker: Ticker) -> list[schedules.TickOutcome]:
    outcomes: list[schedules.TickOutcome] = []
    while (batch := ticker.decide_due(db)) is not None:
        outcomes += batch
    return outcomes


def ledger(client: Any, key: str) -> list[dict[str, Any]]:
    r = client.get(f"/api/v1/workflows/{key}/schedule")
    assert r.status_code == 200, r.get_json()
    return list(reversed(r.get_json()["ledger"]))


def test_catch_up_fires_in_window_ticks_per_policy_and_ledgers_older_ones_missed(
    client: Any, db: psycopg.Connection
) -> None:
    publish(client, "sweep", scheduled({"every_s": 1, "catchup_window_s": 5, "overlap": "allow"}))
    first = rewind(db, "sweep", 20)
    outcomes = decide_all(db, Ticker())
    kinds = [o.outcome for o in outcomes]
    # Ticks 20..6 s ago are older than the window; the last 5 or 6 fire (allow).
    assert kinds.count("missed") in (14, 15, 16) and set(kinds) == {"missed", "fired"}
    assert kinds.index("fired") == kinds.count("missed")
    rows = ledger(client, "sweep")
    assert [r["outcome"] for r in rows] == kinds
    assert rows[0]["tick_at"] == schedules.iso(first)
    ticks = [datetime.fromisoformat(r["tick_at"]) for r in rows]
    assert ticks == [first + timedelta(seconds=n) for n in range(len(ticks))]
    fired = [r for r in rows if r["outcome"] == "fired"]
    executions = db.execute(
        "SELECT e.idempotency_key, e.trigger, e.input->>'scheduled_at' FROM schedule_ticks t"
        " JOIN executions e ON e.id = t.execution_id ORDER BY t.id"
    ).fetchall()
    assert len(executions) == db.execute("SELECT count(*) FROM executions").fetchone()[0]
    assert [(f"schedule:{r['tick_at']}", "schedule", r["tick_at"]) for r in fired] == executions
    # Nothing is due any more: a second pass decides nothing.
    assert Ticker().decide_due(db) is None


def test_a_year_of_downtime_is_one_missed_summary_row(client: Any, db: psycopg.Connection) -> None:
    publish(client, "yearly", scheduled({"every_s": 1, "catchup_window_s": 2}))
    rewind(db, "yearly", 365 * 86400)
    outcomes = decide_all(db, Ticker())
    missed = [o for o in outcomes if o.outcome == "missed"]
    assert len(missed) == 1 and " ticks from " in (missed[0].reason or "")
    assert int((missed[0].reason or "").split()[0]) > 31_535_990
    # Within the window: the first fires, the next are skipped (overlap skip, it is live).
    assert [o.outcome for o in outcomes[1:]][:1] == ["fired"]
    assert {o.outcome for o in outcomes[2:]} <= {"skipped"}


def test_overlap_policies_map_onto_the_schedule_slot(client: Any, db: psycopg.Connection) -> None:
    for policy in ("skip", "buffer_one", "allow", "cancel_other"):
        publish(client, policy.replace("_", "-"), scheduled({"every_s": 1, "overlap": policy}))
        rewind(db, policy.replace("_", "-"), 3)
    outcomes = decide_all(db, Ticker())
    by: dict[str, list[str]] = {}
    for o in outcomes:
        by.setdefault(o.workflow, []).append(o.outcome)
    # Nothing runs the executions here, so the first stays live through the next ticks.
    assert by["skip"][:3] == ["fired", "skipped", "skipped"]
    assert by["buffer-one"][:3] == ["fired", "buffered", "skipped"]
    assert set(by["allow"]) == {"fired"}
    assert set(by["cancel-other"]) == {"fired"}
    statuses = db.execute(
        "SELECT w.key, e.status, e.stop_reason FROM schedule_ticks t"
        " JOIN executions e ON e.id = t.execution_id"
        " JOIN workflows w ON w.id = e.workflow_id WHERE w.key = 'cancel-other'"
        " ORDER BY t.id"
    ).fetchall()
    assert [s[1] for s in statuses[:-1]] == ["cancelled"] * (len(statuses) - 1)
    assert statuses[-1][1] == "queued" and statuses[0][2] == "concurrency"


def test_pause_ledgers_due_ticks_paused_resume_fires_again_with_actors(
    client: Any, db: psycopg.Connection
) -> None:
    publish(client, "pausable", scheduled({"every_s": 1, "overlap": "allow"}))
    r = client.post("/api/v1/workflows/pausable/schedule/pause")
    assert r.status_code == 200 and r.get_json()["paused"] is True
    assert r.get_json()["paused_by"]["kind"] == "api_key"
    rewind(db, "pausable", 2)
    ticker = Ticker()
    assert {o.outcome for o in decide_all(db, ticker)} == {"paused"}
    r = client.post("/api/v1/workflows/pausable/schedule/resume")
    assert r.status_code == 200 and r.get_json()["paused"] is False
    rewind(db, "pausable", 1)
    assert {o.outcome for o in decide_all(db, ticker)} == {"fired"}
    rows = ledger(client, "pausable")
    actions = [r for r in rows if r["outcome"] in ("pause", "resume")]
    assert [a["outcome"] for a in actions] == ["pause", "resume"]
    assert all(a["actor"]["name"] == "tests" for a in actions)


def test_trigger_now_and_backfill_dry_run_then_real(client: Any, db: psycopg.Connection) -> None:
    publish(client, "manual", scheduled({"cron": "0 * * * *", "overlap": "allow"}))
    r = client.post("/api/v1/workflows/manual/schedule/trigger")
    assert r.status_code == 201, r.get_json()
    triggered = r.get_json()
    assert triggered["outcome"] == "fired"
    row = db.execute(
        "SELECT trigger, idempotency_key FROM executions WHERE id = %s",
        (triggered["execution_id"],),
    ).fetchone()
    assert row == ("schedule", f"schedule:{triggered['tick_at']}")
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    span = {
        "from": (now - timedelta(hours=3)).isoformat(),
        "to": (now - timedelta(hours=1)).isoformat(),
    }
    dry = client.post("/api/v1/workflows/manual/schedule/backfill", json={**span, "dry_run": True})
    assert dry.status_code == 200, dry.get_json()
    assert [i["outcome"] for i in dry.get_json()["items"]] == ["would fire"] * 3
    before = db.execute("SELECT count(*) FROM executions").fetchone()
    real = client.post("/api/v1/workflows/manual/schedule/backfill", json=span)
    assert [i["outcome"] for i in real.get_json()["items"]] == ["fired"] * 3
    again = client.post(
        "/api/v1/workflows/manual/schedule/backfill", json={**span, "dry_run": True}
    )
    assert [i["outcome"] for i in again.get_json()["items"]] == ["fired already"] * 3
    after = db.execute("SELECT count(*) FROM executions").fetchone()
    assert before is not None and after is not None and after[0] == before[0] + 3
    rows = ledger(client, "manual")
    assert [r["reason"] for r in rows] == ["triggered by an operator"] + ["backfill"] * 3
    assert all(r["actor"]["kind"] == "api_key" for r in rows)
    # Bounded and in the past only.
    future = {"from": now.isoformat(), "to": (now + timedelta(hours=2)).isoformat()}
    assert client.post("/api/v1/workflows/manual/schedule/backfill", json=future).status_code == 422
    wide = {"from": "2020-01-01T00:00:00Z", "to": (now - timedelta(hours=1)).isoformat()}
    r = client.post("/api/v1/workflows/manual/schedule/backfill", json=wide)
    assert r.status_code == 422 and "1000" in r.get_json()["detail"]
    assert (
        client.post("/api/v1/workflows/manual/schedule/backfill", json={"from": 1}).status_code
        == 422
    )


def test_show_lists_the_next_ten_fire_times_in_the_zone_and_in_utc(client: Any) -> None:
    publish(client, "lisbon", scheduled({"cron": "30 1 * * *", "timezone": "Europe/Lisbon"}))
    shown = client.get("/api/v1/workflows/lisbon/schedule").get_json()
    assert len(shown["next"]) == 10 and shown["timezone"] == "Europe/Lisbon"
    first = shown["next"][0]
    assert first["local"][11:16] == "01:30" and first["tick_at"].endswith("Z")
    assert client.get("/api/v1/workflows/nothing/schedule").status_code == 404


def test_a_new_version_between_ticks_neither_loses_nor_repeats_one(
    client: Any, db: psycopg.Connection
) -> None:
    publish(client, "versioned", scheduled({"every_s": 1, "overlap": "allow", "input": {"v": 1}}))
    rewind(db, "versioned", 3)
    ticker = Ticker()
    first = decide_all(db, ticker)
    # Published while a tick is due and not yet decided: it fires under the new version.
    wait_for(
        lambda: db.execute("SELECT bool_and(fire_at <= now()) FROM schedules").fetchone()[0],
        message="the next tick to be due",
    )
    publish(client, "versioned", scheduled({"every_s": 1, "overlap": "allow", "input": {"v": 2}}))
    second = decide_all(db, ticker)
    ticks = [o.tick_at for o in first + second]
    assert len(ticks) == len(set(ticks))
    rows = db.execute(
        "SELECT v.version, e.input->>'v' FROM schedule_ticks t"
        " JOIN executions e ON e.id = t.execution_id"
        " JOIN workflow_versions v ON v.id = e.version_id ORDER BY t.id"
    ).fetchall()
    assert rows[-1] == (2, "2") and rows[0] == (1, "1")
    # A version without a schedule ends it; the ledger stays.
    publish(
        client, "versioned", {**scheduled({"every_s": 1}), "trigger": {"webhook": {"auth": "none"}}}
    )
    assert client.get("/api/v1/workflows/versioned/schedule").status_code == 404
    assert ticker.decide_due(db) is None


def test_read_only_and_scoped_keys(client: Any, db: psycopg.Connection) -> None:
    publish(client, "guarded", scheduled({"every_s": 60}))
    publish(client, "other", scheduled({"every_s": 60}))
    reader = apikeys.create(db, "reader", read_only=True)[1]
    scoped = apikeys.create(db, "scoped", workflows=["other"])[1]
    headers = {"Authorization": f"Bearer {reader}"}
    assert client.get("/api/v1/workflows/guarded/schedule", headers=headers).status_code == 200
    for action in ("pause", "resume", "trigger"):
        assert (
            client.post(f"/api/v1/workflows/guarded/schedule/{action}", headers=headers).status_code
            == 403
        )
    headers = {"Authorization": f"Bearer {scoped}"}
    assert client.get("/api/v1/workflows/guarded/schedule", headers=headers).status_code == 403
    assert client.post("/api/v1/workflows/other/schedule/pause", headers=headers).status_code == 200


def test_the_ledger_is_trimmed_to_its_newest_rows(client: Any, db: psycopg.Connection) -> None:
    publish(client, "busy", scheduled({"every_s": 1}))
    workflow_id = db.execute("SELECT id FROM workflows WHERE key = 'busy'").fetchone()
    assert workflow_id is not None
    db.execute(
        "INSERT INTO schedule_ticks (workflow_id, tick_at, outcome)"
        " SELECT %s, now() - make_interval(secs => n), 'skipped' FROM generate_series(1, %s) n",
        (workflow_id[0], schedules.LEDGER_KEEP + 50),
    )
    assert schedules.trim(db) == 50
    assert schedules.trim(db) == 0


def test_the_cli_shows_pauses_resumes_triggers_and_backfills(
    client: Any,
    db: psycopg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    publish(client, "nightly", scheduled({"cron": "0 2 * * *", "timezone": "America/New_York"}))
    monkeypatch.setenv("FLOWFORGE_DATABASE_URL", database_url)

    def run(*args: str) -> str:
        assert cli.main(["schedule", *args]) == 0, capsys.readouterr().err
        return capsys.readouterr().out

    shown = run("show", "nightly")
    assert "cron '0 2 * * *' in America/New_York, overlap skip, active" in shown
    assert shown.count("T02:00:00-0") == 10  # the local times, EST or EDT
    assert run("pause", "nightly").strip() == "schedule of nightly is paused"
    assert ", paused" in run("show", "nightly")
    assert run("resume", "nightly").strip() == "schedule of nightly is active"
    assert " fired " in run("trigger", "nightly")
    dry = run(
        "backfill",
        "nightly",
        "--from",
        "2026-01-01T00:00Z",
        "--to",
        "2026-01-03T12:00Z",
        "--dry-run",
    )
    assert dry.count("would fire") == 3 and "dry run" in dry
    assert (
        run(
            "backfill", "nightly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-03T12:00Z"
        ).count(" fired ")
        == 3
    )
    actors = db.execute(
        "SELECT DISTINCT actor->>'kind' FROM schedule_ticks WHERE actor IS NOT NULL"
    ).fetchall()
    assert actors == [("cli",)]
    assert cli.main(["schedule", "show", "nobody"]) == 1
    assert "has no schedule" in capsys.readouterr().err


def test_a_tick_refused_before_any_statement_is_skipped_and_the_batch_goes_on(
    client: Any, db: psycopg.Connection
) -> None:
    keyed = {
        **scheduled({"every_s": 1, "overlap": "allow"}),
        "concurrency": {"limit": 1, "key": "{{ input.customer }}"},
    }
    publish(client, "keyed", keyed)
    publish(client, "plain", scheduled({"every_s": 1, "overlap": "allow"}))
    rewind(db, "keyed", 1)
    rewind(db, "plain", 1)
    outcomes = decide_all(db, Ticker())
    keyed_outcomes = {o.outcome for o in outcomes if o.workflow == "keyed"}
    assert keyed_outcomes == {"skipped"}
    assert all("input.customer" in (o.reason or "") for o in outcomes if o.workflow == "keyed")
    assert {o.outcome for o in outcomes if o.workflow == "plain"} == {"fired"}


def test_one_batch_fires_the_free_schedules_while_live_ones_follow_their_policy(
    client: Any, db: psycopg.Connection
) -> None:
    busy = ("busy-skip", "busy-buffer", "busy-cancel")
    for key, policy in zip(busy, ("skip", "buffer_one", "cancel_other"), strict=True):
        publish(client, key, scheduled({"every_s": 1, "overlap": policy}))
    db.execute(NEXT_SECOND)
    ticker = Ticker()
    wait_for(lambda: ticker.decide_due(db), message="the first ticks")
    # Their executions stay live (nothing runs them); two free schedules join them, and
    # the next tick of all five is decided in one batch.
    publish(client, "free-skip", scheduled({"every_s": 1, "overlap": "skip"}))
    publish(client, "open", scheduled({"every_s": 1, "overlap": "allow"}))
    db.execute(NEXT_SECOND)
    outcomes = wait_for(lambda: ticker.decide_due(db), message="the next ticks")
    assert outcomes is not None
    by: dict[str, schedules.TickOutcome] = {}
    for o in outcomes:
        by.setdefault(o.workflow, o)
    assert len(by) == 5 and {o.tick_at for o in by.values()} == {by["open"].tick_at}
    assert by["busy-skip"].outcome == "skipped"
    assert "is live (overlap skip)" in (by["busy-skip"].reason or "")
    assert by["busy-buffer"].outcome == "buffered"
    assert by["busy-cancel"].outcome == "fired" and by["busy-cancel"].replaced
    assert by["free-skip"].outcome == "fired" and by["open"].outcome == "fired"
    # A batched tick's rows are those of the one-by-one intake: the gated `free-skip`
    # (batched) against `busy-cancel`'s replacement (one by one, started by the slot
    # hand-over), `open` without a slot.
    shape = """
        SELECT e.status, e.trigger, e.concurrency_key, e.slot_at IS NOT NULL,
               e.idempotency_key = 'schedule:' || (e.input->>'scheduled_at'),
               (SELECT array_agg(s.status || '/' || (s.ready_at IS NOT NULL)) FROM steps s
                WHERE s.execution_id = e.id),
               (SELECT array_agg(x.kind ORDER BY x.id) FROM execution_events x
                WHERE x.execution_id = e.id),
               (SELECT count(*) FROM outbox o WHERE o.execution_id = e.id),
               (SELECT count(*) FROM idempotency_keys k
                WHERE k.execution_id = e.id AND k.key = e.idempotency_key)
        FROM executions e WHERE e.id = %s
    """
    rows = {
        key: db.execute(shape, (by[key].execution_id,)).fetchone()
        for key in ("free-skip", "busy-cancel", "open")
    }
    # busy-cancel's replacement waited queued until the holder it cancelled was terminal
    # (at once: nothing ran it), then took the slot as any queued execution does.
    replacement = rows["busy-cancel"]
    assert replacement[6] == ["execution.queued", "execution.slot_granted", "step.ready"]
    assert rows["free-skip"][:6] + rows["free-skip"][7:] == replacement[:6] + replacement[7:]
    assert rows["free-skip"][:5] == ("queued", "schedule", "@schedule", True, True)
    assert rows["open"][2:4] == (None, False) and rows["open"][5:] == (
        ["ready/true"],
        ["execution.queued"],
        1,
        1,
    )
    ledgered = db.execute(
        "SELECT w.key, t.outcome, t.execution_id::text, t.lag_s IS NOT NULL"
        " FROM schedule_ticks t JOIN workflows w ON w.id = t.workflow_id"
        " WHERE t.tick_at = %s ORDER BY t.id",
        (by["open"].tick_at,),
    ).fetchall()
    assert ledgered == [
        (o.workflow, o.outcome, o.execution_id, o.outcome in ("fired", "buffered"))
        for o in by.values()
    ]


def test_two_batches_racing_for_the_same_ticks_create_one_execution_per_tick(
    client: Any, db: psycopg.Connection, database_url: str
) -> None:
    for key, policy in (("race-allow", "allow"), ("race-skip", "skip")):
        publish(client, key, scheduled({"every_s": 1, "overlap": policy}))
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=10)
    allow = schedules.parse_schedule({"every_s": 1, "overlap": "allow"})
    skip = schedules.parse_schedule({"every_s": 1, "overlap": "skip"})
    candidates = [
        Candidate(intake.unsigned_target(db, "race-allow"), allow, base + timedelta(seconds=n))
        for n in range(3)
    ] + [Candidate(intake.unsigned_target(db, "race-skip"), skip, base)]
    results: dict[str, list[str | None]] = {}
    with psycopg.connect(database_url, autocommit=True) as other:
        pid = other.info.backend_pid

        def second() -> None:
            with other.transaction():
                results["second"] = fire_batch(other, candidates)

        with db.transaction():
            results["first"] = fire_batch(db, candidates)
            racer = threading.Thread(target=second)
            racer.start()
            wait_for(
                lambda: db.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()[0],
                message="the second batch to wait for the first",
            )
        racer.join(timeout=30)
    assert all(results["first"]) and results["second"] == [None] * len(candidates)
    rows = db.execute(
        "SELECT idempotency_key, count(*) FROM executions GROUP BY 1 ORDER BY 1"
    ).fetchall()
    # race-skip's tick has the same key as race-allow's first one, in another workflow.
    assert db.execute(
        "SELECT count(*), count(DISTINCT (workflow_id, idempotency_key)) FROM executions"
    ).fetchone() == (len(candidates), len(candidates))
    assert len(rows) == 3
