"""Debounce and batch (docs/contract.md#debounce-batch) through real processes: two bin/api masters
(two gunicorn workers each) take events for the same keys concurrently, redeliveries among
them; then a worker is SIGKILLed inside the transaction that starts a due group, and
another one at a random moment while groups are due. Exactly one execution per
debounce key and per batch of max_items, every event in one of them, none twice."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import requests

from tests.support.api import TERMINAL, Api
from tests.support.processes import WORKER, Process, start_api, wait_for

STEPS = [{"id": "shape", "type": "transform", "output": {"ok": True}}]
CUSTOMERS = ("a", "b", "c")
PER_CUSTOMER = 20
BATCH_EVENTS = 45
MAX_ITEMS = 10


def definition(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    return {"name": kind, "trigger": {"webhook": {"auth": "none", kind: options}}, "steps": STEPS}


def post(base: str, key: str, body: dict[str, Any], identity: str) -> dict[str, Any]:
    r = requests.post(
        f"{base}/hooks/{key}", json=body, headers={"Idempotency-Key": identity}, timeout=30
    )
    assert r.status_code == 202, r.text
    return {"identity": identity, "body": body, **r.json()}


def groups(db: psycopg.Connection, key: str) -> list[tuple[str, str, int, str | None]]:
    return db.execute(
        "SELECT g.status, g.execution_id::text, g.events, g.group_key FROM intake_groups g"
        " JOIN workflows w ON w.id = g.workflow_id WHERE w.key = %s ORDER BY g.id",
        (key,),
    ).fetchall()


def executions(db: psycopg.Connection, key: str) -> dict[str, tuple[str, Any]]:
    rows = db.execute(
        "SELECT e.id::text, e.status, e.input FROM executions e JOIN workflows w"
        " ON w.id = e.workflow_id WHERE w.key = %s",
        (key,),
    ).fetchall()
    return {row[0]: (row[1], row[2]) for row in rows}


def test_one_execution_per_group_through_concurrent_apis_and_killed_workers(
    client: Api,
    db: psycopg.Connection,
    env: dict[str, str],
    tmp_path: Path,
    workers: Callable[..., Process],
) -> None:
    # No worker runs while the events come in: however slow this machine is, every
    # debounce key gathers in one group (max_wait_s is far), every batch closes at max_items.
    client.publish(
        "deb",
        definition("debounce", {"key": "{{ input.customer }}", "window_s": 1, "max_wait_s": 120}),
    )
    client.publish("bat", definition("batch", {"max_items": MAX_ITEMS, "window_s": 1}))
    # A paused workflow's group starts its execution, which the workers then hold paused.
    client.publish("held", definition("debounce", {"window_s": 1}))
    assert client.post("/api/v1/workflows/held/pause").status_code == 200
    apis = [start_api(env, tmp_path / f"api-{n}.log") for n in range(2)]
    bases = [base for _, base in apis]
    sends = [
        ("deb", {"customer": c, "n": n}, f"{c}-{n}") for c in CUSTOMERS for n in range(PER_CUSTOMER)
    ] + [("bat", {"n": n}, f"bat-{n}") for n in range(BATCH_EVENTS)]
    sends += [("held", {"n": n}, f"held-{n}") for n in range(3)]
    redelivered = sends[::4]
    jobs = list(zip(itertools.cycle(bases), sends + redelivered, strict=False))
    try:
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda job: post(job[0], *job[1]), jobs))
    finally:
        for proc, _ in apis:
            proc.stop()
    by_identity: dict[str, set[str]] = {}
    for answer in answers:
        by_identity.setdefault(answer["identity"], set()).add(answer["execution_id"])
    # A redelivery names what its first delivery was recorded against.
    assert all(len(ids) == 1 for ids in by_identity.values())
    assert sorted(g[2] for g in groups(db, "deb")) == [PER_CUSTOMER] * len(CUSTOMERS)
    assert sorted(g[2] for g in groups(db, "bat")) == [5, 10, 10, 10, 10]

    # A worker dies inside the transaction that starts the first due group; two more
    # take over, and one of them is SIGKILLed at once, whatever it is doing.
    # Started bare: it may die before it would count as ready (its scheduler runs first).
    killer = Process(WORKER, {**env, "FLOWFORGE_FAULTS": "group_started=kill"}, tmp_path / "k.log")
    wait_for(lambda: killer.popen.poll() is not None, timeout=60, message="the armed worker to die")
    assert "fault point reached" in killer.log()
    survivors = [workers(), workers()]
    wait_for(
        lambda: "intake group started" in survivors[0].log() + survivors[1].log(),
        timeout=60,
        message="a survivor to start a group",
    )
    survivors[0].kill()

    def settled() -> bool:
        keys = ("deb", "bat", "held")
        pending = [g for key in keys for g in groups(db, key) if g[0] != "started"]
        runs = [r for key in ("deb", "bat") for r in executions(db, key).values()]
        held = [status for status, _ in executions(db, "held").values()]
        return not pending and all(s in TERMINAL for s, _ in runs) and held == ["paused"]

    wait_for(settled, timeout=90, message="every group started and finished")

    deb_runs = executions(db, "deb")
    deb_groups = groups(db, "deb")
    assert sorted(deb_runs) == sorted(g[1] for g in deb_groups)  # one each, none twice
    for status, key, events, execution_id in ((g[0], g[3], g[2], g[1]) for g in deb_groups):
        assert status == "started" and events == PER_CUSTOMER
        state, data = deb_runs[execution_id]
        assert state == "succeeded" and data["customer"] == key
        assert data["debounced"] == PER_CUSTOMER - 1
        # Every event of the key was recorded against this execution.
        mine = {a["execution_id"] for a in answers if a["body"].get("customer") == key}
        assert mine == {execution_id}
        # Its input is the last event recorded, as the API shows what it was built from.
        built = client.execution(execution_id)["built_from"]
        assert built["event_list"][-1]["body"] == {
            k: v for k, v in data.items() if k != "debounced"
        }
        assert sorted(e["body"]["n"] for e in built["event_list"]) == list(range(PER_CUSTOMER))

    bat_runs = executions(db, "bat")
    assert sorted(bat_runs) == sorted(g[1] for g in groups(db, "bat"))
    seen = sorted(e["n"] for _, data in bat_runs.values() for e in data["events"])
    assert seen == list(range(BATCH_EVENTS))  # every event once: none lost, none twice
    ((_, held),) = executions(db, "held").values()
    assert held["debounced"] == 2
    assert sorted(len(data["events"]) for _, data in bat_runs.values()) == [5, 10, 10, 10, 10]
    for answer in (a for a in answers if a["identity"].startswith("bat-")):
        _, data = bat_runs[answer["execution_id"]]
        assert answer["body"] in data["events"]
