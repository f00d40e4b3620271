"""docs/contract.md#priority priorities through real bin/api and bin/worker processes: under a
backlog the higher priority goes first, ageing lets a lower one in under a constant stream of higher
ones, the priority comes from the input when the definition says so, a rendered value
that is no priority refuses the webhook with nothing stored, and the claim's look for a
better step stays an index scan over a backlog of 50,000 ready steps."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
import requests

from flowforge.store.priorities import BETTER_READY, BETTER_TRIES, READY_PRIORITY_SPREAD
from tests.support.api import Api
from tests.support.definitions import http, transform, workflow
from tests.support.processes import Process, free_port, wait_for
from tests.support.target import Received, Reply, Target

LOW, HIGH = 0, 50


def jobs(target: Target, **top: Any) -> dict[str, Any]:
    """One GET per execution; its path says which execution it is."""
    call = http("call", "GET", f"{target.url}/job/{{{{ input.kind }}}}/{{{{ input.n }}}}")
    return workflow(call, name="jobs", **{"priority": "{{ input.priority }}", **top})


def slow(delay_s: float) -> Callable[[Received], Reply]:
    return lambda _r: Reply(json={"ok": True}, delay_s=delay_s)


def kinds(target: Target) -> list[str]:
    """The kind of each request the target saw, in the order they arrived."""
    return [r.path.split("/")[2] for r in list(target.received)]


def succeeded(db: psycopg.Connection) -> int:
    (n,) = db.execute("SELECT count(*) FROM executions WHERE status = 'succeeded'").fetchone() or (
        0,
    )
    return int(n)


@pytest.fixture
def client(api: str, api_key: str) -> Api:
    return Api(api, api_key)


def start_many(client: Api, payloads: list[dict[str, Any]]) -> list[str]:
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda p: client.start("jobs", p), payloads))


def test_under_a_backlog_high_priority_executions_finish_before_most_low_ones(
    client: Api, target: Target, workers: Callable[..., Process], db: psycopg.Connection
) -> None:
    target.script = slow(0.01)
    client.publish("jobs", jobs(target))
    start_many(client, [{"kind": "low", "n": n, "priority": LOW} for n in range(300)])
    port = free_port()
    workers(FLOWFORGE_WORKER_CONCURRENCY="2", FLOWFORGE_METRICS_PORT=str(port))
    wait_for(lambda: len(target.received) >= 20, timeout=30, message="the backlog draining")
    high = start_many(client, [{"kind": "high", "n": n, "priority": HIGH} for n in range(20)])
    wait_for(lambda: succeeded(db) == 320, timeout=60, message="all 320 executions")
    order = kinds(target)
    assert order.count("high") == 20 and order.count("low") == 300
    last_high = max(i for i, kind in enumerate(order) if kind == "high")
    lows_after = order[last_high:].count("low")
    # In FIFO order every high one would come after the 300 low ones.
    assert lows_after > 150, f"only {lows_after} low executions ran after the last high one"
    assert {client.execution(eid)["priority"] for eid in high} == {HIGH}
    # Each high one went first through the wake-up of a low one, which was dispatched again.
    scraped = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    [taken] = [
        float(line.split()[1])
        for line in scraped.splitlines()
        if line.startswith("flowforge_priority_taken_first_total ")
    ]
    assert taken >= 10, taken


def test_ageing_lets_a_low_priority_execution_in_under_a_constant_stream_of_high_ones(
    client: Api, target: Target, workers: Callable[..., Process], db: psycopg.Connection
) -> None:
    # Ageing 0.25 s per point: priority 8 goes first for 2 s of waiting, then the low one
    # ranks first again. The stream keeps ~2 s of high-priority work queued throughout.
    target.script = slow(0.05)
    client.publish("jobs", jobs(target))
    workers(FLOWFORGE_WORKER_CONCURRENCY="1", FLOWFORGE_PRIORITY_AGEING_S="0.25")
    sent = {"high": 0}
    stop = threading.Event()
    low_created: list[float] = []
    high_created: dict[int, float] = {}

    def feed() -> None:
        while not stop.is_set():
            if sent["high"] - kinds(target).count("high") < 40:
                n = sent["high"]
                high_created[n] = time.time()
                client.start("jobs", {"kind": "high", "n": n, "priority": 8})
                sent["high"] += 1
            else:
                time.sleep(0.01)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        wait_for(lambda: len(target.received) >= 20, timeout=30, message="the stream flowing")
        low_created.append(time.time())
        low = client.start("jobs", {"kind": "low", "n": 0, "priority": LOW})
        # The bound: a few times the ageing window, while the stream goes on (strict
        # priority, without ageing, never lets it in: this wait times out).
        done = client.wait(low, timeout=40)
    finally:
        stop.set()
        feeder.join(timeout=10)
    assert done["status"] == "succeeded" and done["priority"] == LOW
    received = list(target.received)
    low_at = next(i for i, r in enumerate(received) if r.path.startswith("/job/low/"))
    # Priority held while it lasted: high ones created after the low one ran before it.
    overtook = [
        r for r in received[:low_at] if high_created[int(r.path.rsplit("/", 1)[1])] > low_created[0]
    ]
    assert overtook, "no high-priority execution created after the low one ran before it"
    # And ageing ended it: high ones queued before the low one finished ran after it.
    wait_for(lambda: succeeded(db) == sent["high"] + 1, timeout=30, message="the stream drained")
    after = [r for r in list(target.received)[low_at + 1 :] if r.path.startswith("/job/high/")]
    assert after, "the low-priority execution ran last"


def test_priority_from_the_input_a_literal_and_refusals(open_client: Any, db: Any) -> None:
    client = open_client
    definition = workflow(transform("shape", {}), name="p", priority="{{ input.order.priority }}")
    assert client.post("/api/v1/workflows/p/versions", json=definition).status_code == 201

    def priority_of(body: Any) -> int:
        r = client.post("/hooks/p", json=body)
        assert r.status_code == 202, r.get_data(as_text=True)
        execution = client.get(f"/api/v1/executions/{r.get_json()['execution_id']}").get_json()
        return int(execution["priority"])

    assert priority_of({"order": {"priority": 7}}) == 7
    assert priority_of({"order": {"priority": -100}}) == -100
    assert priority_of({"order": {}}) == 0  # absent: the default
    assert priority_of({"order": {"priority": None}}) == 0
    (before,) = db.execute("SELECT count(*) FROM executions").fetchone()
    for bad in ("high", 7.5, 101, True, [1], {"p": 1}):
        r = client.post("/hooks/p", json={"order": {"priority": bad}})
        assert r.status_code == 422, (bad, r.get_data(as_text=True))
        assert r.headers["Content-Type"] == "application/problem+json"
        assert "priority" in r.get_json()["detail"]
    assert db.execute("SELECT count(*) FROM executions").fetchone() == (before,)
    assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] <= before
    listed = client.get("/api/v1/executions?workflow=p").get_json()["items"]
    assert sorted(item["priority"] for item in listed) == [-100, 0, 0, 7]
    # A literal: every execution of the version has it, whatever the input.
    literal = {**definition, "priority": 42}
    assert client.post("/api/v1/workflows/p/versions", json=literal).status_code == 201
    assert priority_of({"order": {"priority": 7}}) == 42
    # And a definition whose priority is no priority is refused at publish.
    for bad in (101, "{{ secrets.p }}", "urgent {{ input.p }}", 1.5):
        r = client.post("/api/v1/workflows/p/versions", json={**definition, "priority": bad})
        assert r.status_code == 422, bad
        assert r.get_json()["errors"][0]["path"] == "$.priority"


def test_the_look_for_a_better_step_is_an_index_scan_over_50000_ready_steps(
    open_client: Any, db: psycopg.Connection
) -> None:
    r = open_client.post("/hooks/open", json={"n": 1})
    assert r.status_code == 202
    eid = r.get_json()["execution_id"]
    # 50,000 executions like it, each with one ready step, over ten priorities.
    db.execute(
        """
        INSERT INTO executions (id, workflow_id, version_id, status, input, priority)
        SELECT gen_random_uuid(), workflow_id, version_id, 'running', input, (g %% 10) * 10 - 40
        FROM executions, generate_series(1, 50000) g WHERE id = %(id)s
        """,
        {"id": eid},
    )
    db.execute(
        """
        INSERT INTO steps (execution_id, step_id, type, position, status, ready_at,
                           ready_since, priority)
        SELECT e.id, 'call', 'http_request', 1, 'ready', now(),
               now() - random() * interval '1 hour', e.priority
        FROM executions e WHERE e.id <> %(id)s
        """,
        {"id": eid},
    )
    db.execute("ANALYZE steps")
    db.execute("ANALYZE executions")
    (step_id,) = db.execute(
        "SELECT step_id FROM steps WHERE execution_id = %(id)s", {"id": eid}
    ).fetchone()
    params = {"execution_id": eid, "step_id": step_id, "ageing_s": 10.0, "tries": BETTER_TRIES}
    # The named step is the newest, priority 0: the better ones are the higher priorities'.
    db.execute(
        "UPDATE steps SET status = 'ready', ready_since = now() WHERE execution_id = %(id)s",
        {"id": eid},
    )
    (plan,) = db.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + BETTER_READY, params
    ).fetchone()
    text = json.dumps(plan)
    assert "steps_ready_priority" in text
    assert '"Seq Scan"' not in text
    # One probe per priority present, not a walk over the backlog (a plan that filtered
    # the priorities instead of probing read some 25,000 blocks here).
    top = plan[0]["Plan"]
    blocks = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    assert blocks < 1_000, blocks
    # The check that lets a wake-up skip the search while all priorities are equal reads
    # the two ends of the same index.
    (spread,) = db.execute("EXPLAIN (FORMAT JSON) " + READY_PRIORITY_SPREAD).fetchone()
    assert "steps_ready_priority" in json.dumps(spread) and '"Seq Scan"' not in json.dumps(spread)
    assert db.execute(READY_PRIORITY_SPREAD).fetchone() == (True,)
    rows = db.execute(BETTER_READY, params).fetchall()
    assert len(rows) == BETTER_TRIES
    best = db.execute(
        """
        SELECT execution_id FROM steps
        WHERE status = 'ready' AND priority > 0
        ORDER BY ready_since - make_interval(secs => priority * 10.0) LIMIT %(n)s
        """,
        {"n": BETTER_TRIES},
    ).fetchall()
    assert [r[0] for r in rows] == [b[0] for b in best]
