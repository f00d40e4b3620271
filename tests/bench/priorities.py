"""Priority figures (issue 30, docs/contract.md#priority): how long high-priority work waits under a
backlog of low-priority work, against the low-priority work itself.

- `priority_wait_ms`: a backlog of low-priority executions (priority 0, one GET each to
  the local stub) is bulk-loaded ready, as the intake writes them, with their wake-ups in
  the outbox; the worker then drains it while high-priority executions (priority 50)
  arrive through the real webhook at a steady pace. The wait of an execution is from its
  creation to the start of its first attempt. Printed: the p99 wait of each priority and
  their ratio (low / high), with FLOWFORGE_PRIORITY_AGEING_S at its default and, for the
  comparison, at 0 (priorities off: the broker's FIFO order).
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from tests.bench.infra import BenchError
from tests.bench.session import Session
from tests.support.definitions import http, workflow

LOW, HIGH = 0, 50
HIGH_COUNT = 100
HIGH_RATE = 50.0  # webhooks per second, open loop, while the backlog drains


def definition(stub_url: str) -> dict[str, Any]:
    return workflow(
        http("get", "GET", f"{stub_url}/x"),
        name="One GET, priority from the input",
        priority="{{ input.priority }}",
    )


def publish(session: Session, stub_url: str) -> None:
    session.publish("prio", definition(stub_url))


def load_backlog(session: Session, count: int) -> None:
    """`count` low-priority executions, each with its one step ready and its wake-up in
    the outbox, as the intake writes them."""
    prio = session.workflows["prio"]
    with session.conn.transaction():
        session.conn.execute(
            "CREATE TEMP TABLE low_ids ON COMMIT DROP AS "
            "SELECT gen_random_uuid() AS id FROM generate_series(1, %s)",
            (count,),
        )
        session.conn.execute(
            "INSERT INTO executions (id, workflow_id, version_id, status, input, priority) "
            "SELECT id, %s, %s, 'queued', %s, %s FROM low_ids",
            (prio.workflow_id, prio.version_id, json.dumps({"priority": LOW}), LOW),
        )
        session.conn.execute(
            "INSERT INTO steps (execution_id, step_id, type, position, status, ready_at, "
            "ready_since, priority) "
            "SELECT id, 'get', 'http_request', 1, 'ready', now(), now(), %s FROM low_ids",
            (LOW,),
        )
        session.conn.execute(
            "INSERT INTO outbox (execution_id, step_id) SELECT id, 'get' FROM low_ids"
        )
    session.conn.execute("ANALYZE steps")


def _send_high(session: Session, tag: str) -> list[str]:
    url = session.hook_url("prio")
    http = requests.Session()
    ids = []
    started = time.monotonic()
    for n in range(HIGH_COUNT):
        time.sleep(max(0.0, started + n / HIGH_RATE - time.monotonic()))
        r = http.post(
            url,
            data=json.dumps({"priority": HIGH, "n": n}),
            headers={"Content-Type": "application/json", "Idempotency-Key": f"p-{tag}-{n}"},
            timeout=30,
        )
        if r.status_code != 202:
            raise BenchError(f"priority webhook answered {r.status_code}: {r.text[:200]}")
        ids.append(r.json()["execution_id"])
    return ids


WAITS = """
SELECT e.priority, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY w),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY w)
FROM (SELECT e.id, e.priority,
             extract(epoch FROM (SELECT min(a.started_at) FROM attempts a
                                 WHERE a.execution_id = e.id) - e.created_at) * 1000 AS w
      FROM executions e WHERE e.workflow_id = %s) AS e
GROUP BY e.priority ORDER BY e.priority
"""


def once(session: Session, backlog: int, ageing_s: str | None) -> dict[str, Any]:
    """One backlog drained with the worker's ageing set to `ageing_s` (None: default)."""
    prio = session.workflows["prio"]
    session.stop_worker()
    session.reset()
    saved = dict(session.extra_env)
    if ageing_s is not None:
        session.extra_env["FLOWFORGE_PRIORITY_AGEING_S"] = ageing_s
    try:
        load_backlog(session, backlog)
        session.start_worker()
        with ThreadPoolExecutor(1) as pool:
            high = pool.submit(_send_high, session, uuid.uuid4().hex[:6]).result(timeout=120)
        deadline = time.monotonic() + 300
        while True:
            (left,) = session.conn.execute(
                "SELECT count(*) FROM executions WHERE workflow_id = %s "
                "AND status NOT IN ('succeeded', 'failed', 'cancelled')",
                (prio.workflow_id,),
            ).fetchone()
            if left == 0:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"{left} priority executions still running after 300 s")
            time.sleep(0.2)
    finally:
        session.stop_worker()
        session.extra_env = saved
        session.start_worker()
    rows = {
        int(p): (int(n), float(p50), float(p99))
        for p, n, p50, p99 in session.conn.execute(WAITS, (prio.workflow_id,))
    }
    if set(rows) != {LOW, HIGH} or rows[HIGH][0] != len(high):
        raise BenchError(f"unexpected priority executions: {rows}")
    return {
        "backlog": backlog,
        "high": len(high),
        "low_p50_ms": rows[LOW][1],
        "low_p99_ms": rows[LOW][2],
        "high_p50_ms": rows[HIGH][1],
        "high_p99_ms": rows[HIGH][2],
        "low_vs_high_p99": rows[LOW][2] / max(rows[HIGH][2], 0.001),
    }


def run(session: Session, backlog: int) -> dict[str, Any]:
    """The figure with priorities on (the default ageing) and, to compare, off."""
    return {"on": once(session, backlog, None), "off": once(session, backlog, "0")}


def show(figure: dict[str, Any]) -> str:
    on, off = figure["on"], figure["off"]
    return (
        f"high p99 {on['high_p99_ms']:.0f} ms vs low p99 {on['low_p99_ms']:.0f} ms "
        f"({on['backlog']:,} low queued; with priorities off high p99 {off['high_p99_ms']:.0f} ms)"
    )


def describe(figure: dict[str, Any]) -> str:
    """The table's note beside the high-priority p99."""
    on, off = figure["on"], figure["off"]
    return (
        f"priority {HIGH} arriving under {on['backlog']:,} queued at priority {LOW}: low p99 "
        f"{on['low_p99_ms']:.0f} ms; priorities off: high p99 {off['high_p99_ms']:.0f} ms"
    )
