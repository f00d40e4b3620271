"""Flow-control figures (issue 12): what a concurrency limit costs, and fairness.

- `chain3_limited_ratio`: chain3 executions per second with `concurrency: {limit: 8}`
  divided by the same without a limit (target >= 0.9). Every execution that ends hands
  its slot on under the key's lock, so this is the price of that serialisation.
- `quiet_key_latency_ms`: with 10,000 executions queued on one key (limit 1 per key), the
  first (and only) execution of each quiet key, from acceptance to finish (target p99
  <= 1 s). The backlog is bulk-loaded as the intake would have queued it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import requests

from flowforge.store import flowcontrol
from tests.bench.figures import ExecutionRun, executions
from tests.bench.infra import BenchError
from tests.bench.session import CHAIN3, Session

LIMITED = {**CHAIN3, "name": "Three transforms, limit 8", "concurrency": {"limit": 8}}
FAIR = {
    **CHAIN3,
    "name": "Three transforms, limit 1 per customer",
    "concurrency": {"limit": 1, "key": "{{ input.customer }}"},
}
BACKLOG = 10_000
QUIET_KEYS = 50


def publish(session: Session) -> None:
    """The two workflows of this module."""
    session.publish("chain3_limited", LIMITED)
    session.publish("fair", FAIR)


def limited(session: Session, count: int, connections: int) -> ExecutionRun:
    """One batch of chain3 executions through a limit of 8."""
    return executions(session, "chain3_limited", count, connections, measure_commits=False)


def queue_backlog(session: Session, count: int) -> None:
    """`count` executions queued on key "busy", as the intake writes them when the key's
    slot is taken: no slot, every step pending, no wake-up."""
    fair = session.workflows["fair"]
    with session.conn.transaction():
        session.conn.execute(
            "CREATE TEMP TABLE busy_ids ON COMMIT DROP AS "
            "SELECT gen_random_uuid() AS id, clock_timestamp() AS at "
            "FROM generate_series(1, %s)",
            (count,),
        )
        session.conn.execute(
            "INSERT INTO executions (id, workflow_id, version_id, status, input, "
            "concurrency_key, created_at) "
            "SELECT id, %s, %s, 'queued', "
            '\'{"customer": "busy", "order_id": 1, "total": 1}\', \'busy\', at '
            "FROM busy_ids",
            (fair.workflow_id, fair.version_id),
        )
        session.conn.execute(
            "INSERT INTO steps (execution_id, step_id, type, position, status) "
            "SELECT id, s.step_id, 'transform', s.position, 'pending' FROM busy_ids, "
            "(VALUES ('a', 1), ('b', 2), ('c', 3)) AS s(step_id, position)"
        )
    session.conn.execute("VACUUM ANALYZE executions")


def quiet_key_latency(session: Session, backlog: int = BACKLOG) -> dict[str, Any]:
    """Latency of quiet keys' executions while `backlog` wait on one busy key."""
    fair = session.workflows["fair"]
    session.reset()
    session.stats_dirty = True
    queue_backlog(session, backlog)
    # Hand the busy key's free slot to its queue's head, as the reconciler would within a
    # pass; from then on the busy key drains one execution at a time, each handing its
    # slot on as it ends.
    with session.conn.transaction():
        flowcontrol.fill_slots(session.conn, fair.workflow_id, "busy")
    url = session.hook_url("fair")
    tag = uuid.uuid4().hex[:6]
    ids: list[str] = []
    for n in range(QUIET_KEYS):
        r = requests.post(
            url,
            data=json.dumps({"customer": f"quiet-{tag}-{n}", "order_id": n, "total": 1}),
            headers={"Content-Type": "application/json", "Idempotency-Key": f"q-{tag}-{n}"},
            timeout=30,
        )
        if r.status_code != 202:
            raise BenchError(f"quiet webhook answered {r.status_code}: {r.text[:200]}")
        ids.append(r.json()["execution_id"])
        time.sleep(0.05)
    deadline = time.monotonic() + 60
    while True:
        row = session.conn.execute(
            "SELECT count(*) FILTER (WHERE status IN ('succeeded', 'failed', 'cancelled')), "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY d), "
            "percentile_cont(0.99) WITHIN GROUP (ORDER BY d), max(d), "
            "(SELECT count(*) FROM executions WHERE workflow_id = %s "
            " AND concurrency_key = 'busy' AND status = 'queued'), "
            "count(*) FILTER (WHERE status <> 'succeeded') "
            "FROM (SELECT status, extract(epoch FROM finished_at - created_at) * 1000 AS d "
            "      FROM executions WHERE id = ANY(%s::uuid[])) AS x",
            (fair.workflow_id, ids),
        ).fetchone()
        if row[0] == len(ids):
            break
        if time.monotonic() > deadline:
            raise BenchError(f"only {row[0]} of {len(ids)} quiet executions finished in 60 s")
        time.sleep(0.2)
    return {
        "p50": float(row[1]),
        "p99": float(row[2]),
        "max": float(row[3]),
        "samples": len(ids),
        "busy_still_queued": int(row[4]),
        "failed": int(row[5]),
        "backlog": backlog,
    }
