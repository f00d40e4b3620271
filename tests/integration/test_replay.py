"""docs/contract.md#replay replay / fork through real bin/api and bin/worker processes: a replay
from a step onto a newer version keeps the upstream outputs and re-sends nothing upstream
(checked at a recording target), is linked both ways with the actor in both histories,
and is refused with errors[] paths when the upstream part differs or holds an unknown
step; bulk replay of 1,000 failed executions by filter, previewed, confirmed, in batches."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from tests.support.api import Api, step
from tests.support.definitions import unsigned
from tests.support.processes import Process
from tests.support.target import Received, Reply, Target


def flow(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return unsigned(steps, "flow")


def charge(url: str, **request: Any) -> dict[str, Any]:
    return {
        "id": "charge",
        "type": "http_request",
        "request": {"method": "POST", "url": url, "json": {"n": "{{ input.n }}"}, **request},
    }


def notify(url: str) -> dict[str, Any]:
    return {
        "id": "notify",
        "type": "http_request",
        "depends_on": ["charge"],
        "request": {"method": "POST", "url": url, "json": {"charge": "{{ charge.body.id }}"}},
    }


@pytest.fixture
def client(api: str, api_key: str) -> Api:
    return Api(api, api_key)


def paths(target: Target) -> list[str]:
    return [r.path for r in target.received]


def test_a_replay_onto_the_fixed_version_keeps_upstream_outputs_and_resends_nothing(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    def script(received: Received) -> Reply:
        if received.path == "/charge":
            return Reply(json={"id": f"ch_{received.json()['n']}"})
        if received.path == "/broken":
            return Reply(status=400, json={"error": "bad endpoint"})
        return Reply(json={"ok": True})

    target.script = script
    client.publish("pay", flow([charge(f"{target.url}/charge"), notify(f"{target.url}/broken")]))
    workers()
    original = client.start("pay", {"n": 7})
    assert client.wait(original)["status"] == "failed"
    assert paths(target) == ["/charge", "/broken"]

    # The fix is a new version: notify goes to the right endpoint.
    client.publish("pay", flow([charge(f"{target.url}/charge"), notify(f"{target.url}/notify")]))
    r = client.post(
        f"/api/v1/executions/{original}/replay", {"from_step": "notify", "version": "latest"}
    )
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["replay_of"] == original and made["version"] == 2
    assert r.headers["Location"] == f"/api/v1/executions/{made['execution_id']}"
    replayed = client.wait(made["execution_id"])
    assert replayed["status"] == "succeeded"
    assert replayed["replay_of"] == original and replayed["replay_from"] == "notify"
    kept = step(replayed, "charge")
    assert kept["status"] == "succeeded" and kept["attempts"] == []
    # Nothing upstream was sent again; the fixed step used the recorded charge id.
    assert paths(target) == ["/charge", "/broken", "/notify"]
    assert target.received[-1].json() == {"charge": "ch_7"}
    shown = client.execution(original)
    assert shown["replayed_by"] == [made["execution_id"]]
    (event,) = [e for e in shown["events"] if e["kind"] == "execution.replayed"]
    assert event["detail"]["actor"]["kind"] == "api_key"
    assert event["detail"]["replayed_by"] == made["execution_id"]
    created = replayed["events"][0]["detail"]
    assert created["replay_of"] == original and created["actor"]["kind"] == "api_key"


def test_replay_is_refused_with_paths_when_upstream_differs_or_is_unknown(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    def script(received: Received) -> Reply:
        if received.json().get("n") == 2:
            time.sleep(2)  # past the attempt's timeout: the outcome is unknown
        return Reply(status=400 if received.path == "/broken" else 200, json={"id": "ch"})

    target.script = script
    slow = charge(f"{target.url}/charge", timeout_s=0.5)
    client.publish("pay", flow([slow, notify(f"{target.url}/broken")]))
    workers()
    failed, unknown = client.start("pay", {"n": 1}), client.start("pay", {"n": 2})
    assert client.wait(failed)["status"] == "failed"
    assert client.wait(unknown)["status"] == "needs_attention"
    sent = len(target.received)

    # Version 2 makes charge a transform: the upstream part differs.
    client.publish(
        "pay",
        flow(
            [
                {"id": "charge", "type": "transform", "output": {"id": "x"}},
                notify(f"{target.url}/notify"),
            ]
        ),
    )
    r = client.post(f"/api/v1/executions/{failed}/replay", {"from_step": "notify"})
    assert r.status_code == 409, r.text
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.json()["errors"] == [
        {"path": "$.steps.charge.type", "message": "http_request there, transform here"}
    ]
    # On its own version, the unknown upstream step must be resolved first.
    r = client.post(f"/api/v1/executions/{unknown}/replay", {"from_step": "notify", "version": 1})
    assert r.status_code == 409, r.text
    assert [e["path"] for e in r.json()["errors"]] == ["$.steps.charge"]
    assert "unknown" in r.json()["errors"][0]["message"]
    # A step the version does not have, or a bad version, is a 422 naming the field.
    r = client.post(f"/api/v1/executions/{failed}/replay", {"from_step": "nope", "version": 1})
    assert r.status_code == 422 and r.json()["errors"][0]["path"] == "$.from_step"
    r = client.post(f"/api/v1/executions/{failed}/replay", {"from_step": "notify", "version": 9})
    assert r.status_code == 422 and r.json()["errors"][0]["path"] == "$.version"
    r = client.post(f"/api/v1/executions/{failed}/replay", {"from_step": "notify", "x": 1})
    assert r.status_code == 422 and r.json()["errors"][0]["path"] == "$.x"
    # Replaying from the first step on version 1 re-sends charge: that is what was asked.
    r = client.post(f"/api/v1/executions/{failed}/replay", {"from_step": "charge", "version": 1})
    assert r.status_code == 201, r.text
    assert client.wait(r.json()["execution_id"])["status"] == "failed"
    assert len(target.received) == sent + 2
    assert client.execution(failed)["replayed_by"] == [r.json()["execution_id"]]


def test_bulk_replay_of_a_thousand_failed_executions_onto_the_new_version(
    client: Api, workers: Callable[..., Process], db: psycopg.Connection
) -> None:
    mark = {"id": "mark", "type": "transform", "output": {"n": "{{ input.n }}"}}
    broken = {
        "id": "shape",
        "type": "transform",
        "depends_on": ["mark"],
        "output": "{{ mark.missing.deep }}",
    }
    client.publish("bulk", flow([mark, broken]))
    workers()
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda n: client.start("bulk", {"n": n}), range(1000)))
    for eid in (ids[0], ids[-1]):
        assert client.wait(eid, timeout=120)["status"] == "failed"
    deadline = time.monotonic() + 120
    while db.execute("SELECT count(*) FROM executions WHERE status = 'failed'").fetchone() != (
        1000,
    ):
        assert time.monotonic() < deadline, "1000 failed executions"
        time.sleep(0.5)

    body: dict[str, Any] = {
        "filter": {"workflow": "bulk", "version": 1, "status": "failed", "error": "MISSING"},
        "from_step": "shape",
        "version": "latest",
    }
    # Unconfirmed: refused, nothing made.
    r = client.post("/api/v1/executions/replay", body)
    assert r.status_code == 422 and r.json()["errors"][0]["path"] == "$.upto"
    preview = client.post("/api/v1/executions/replay", {**body, "dry_run": True}).json()
    assert preview["count"] == 1000 and preview["upto"] == max(ids)
    late = client.start("bulk", {"n": 1000})  # failed too, but after the preview: stays out
    assert client.wait(late, timeout=30)["status"] == "failed"
    fixed = {**broken, "output": {"n": "{{ mark.n }}"}}
    client.publish("bulk", flow([mark, fixed]))
    started = time.monotonic()
    after, batches, replayed = None, 0, 0
    while True:
        r = client.post(
            "/api/v1/executions/replay",
            {**body, "upto": preview["upto"], "after": after, "limit": 200},
        )
        assert r.status_code == 200, r.text
        batches += 1
        replayed += len(r.json()["replayed"])
        assert r.json()["refused"] == []
        after = r.json()["next_after"]
        if after is None:
            break
    print(f"bulk replay: 1000 executions in {batches} batches, {time.monotonic() - started:.1f} s")
    assert replayed == 1000
    counts = dict(
        db.execute(
            "SELECT status, count(*) FROM executions WHERE replay_of IS NOT NULL GROUP BY status"
        ).fetchall()
    )
    assert counts == {"succeeded": 1000}
    # The kept step was not run again: no attempt of mark in any replay.
    assert db.execute(
        "SELECT count(*) FROM attempts a JOIN executions e ON e.id = a.execution_id "
        "WHERE e.replay_of IS NOT NULL AND a.step_id = 'mark'"
    ).fetchone() == (0,)
    assert db.execute(
        "SELECT count(DISTINCT detail->'actor'->>'name') FROM execution_events "
        "WHERE kind = 'execution.replayed'"
    ).fetchone() == (1,)
    replays_of_late = db.execute("SELECT count(*) FROM executions WHERE replay_of = %s", (late,))
    assert replays_of_late.fetchone() == (0,)
    # Again: only the late arrival is left (a bulk replay takes each execution once).
    again = client.post("/api/v1/executions/replay", {**body, "dry_run": True}).json()
    assert again == {"dry_run": True, "count": 1, "upto": late}
