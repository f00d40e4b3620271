"""Resume → next step started: how long after a resume commits its next step is claimed.

    .venv/bin/python -m tests.bench.resume_latency [--executions 300] [--rate 50]

(bin/bench measures the same, as resume_latency_ms, after its latency phase.)

Starts bin/api and bin/worker in a private database and RabbitMQ vhost (tests/bench
session), publishes a workflow whose root is a wait step followed by a GET to a local
stub, starts `--executions` executions and, once they all wait, resumes them open-loop
at `--rate` per second through POST /hooks/resume/<token>. The latency of each is the
next step's started_at (the worker's claim) minus the resume's applied_at, both read
from PostgreSQL's clock: relay, RabbitMQ, consumer and claim. Prints p50/p99/max. A
figure, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from flowforge.trust import resume_tokens
from tests.bench.figures import Stub
from tests.bench.infra import ADMIN_DATABASE, BenchError
from tests.bench.session import RESUME_KEY, Session
from tests.support.definitions import http, wait, workflow

LATENCY = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.99)
       WITHIN GROUP (ORDER BY d), max(d), count(*)
FROM (SELECT extract(epoch FROM s.started_at - r.applied_at) * 1000 AS d
      FROM resumes r JOIN steps s ON s.execution_id = r.execution_id AND s.step_id = 'next'
      WHERE r.applied_at IS NOT NULL AND s.started_at IS NOT NULL) AS x
"""


def definition(stub_url: str) -> dict[str, Any]:
    """A wait step, then the step whose start is measured."""
    return workflow(
        wait("approval", 3600),
        http("next", "GET", f"{stub_url}/next", after=("approval",)),
        name="Resume latency",
    )


def _count(session: Session, sql: str) -> int:
    return int(session.scalar(sql))


def _until(session: Session, sql: str, wanted: int, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while _count(session, sql) < wanted:
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.2)


def measure(session: Session, stub_url: str, executions: int, rate: float) -> dict[str, float]:
    """Resume `executions` waiting executions open-loop at `rate`; the latency figures.

    Needs bin/api and bin/worker running in `session`; publishes its own workflow."""
    if "resume" not in session.workflows:
        session.publish("resume", definition(stub_url))
    session.reset()
    key = resume_tokens.parse_key(RESUME_KEY)
    http = requests.Session()
    ids = [
        http.post(
            session.hook_url("resume"),
            json={"n": n},
            headers={"Idempotency-Key": f"r-{uuid.uuid4().hex}"},
            timeout=30,
        ).json()["execution_id"]
        for n in range(executions)
    ]
    _until(
        session,
        "SELECT count(*) FROM steps WHERE step_id = 'approval' AND status = 'waiting'",
        len(ids),
        120,
        "every execution to wait",
    )
    started = time.monotonic()

    def resume(index: int) -> int:
        # Open loop: each resume leaves at its planned instant, however slow the last.
        time.sleep(max(0.0, started + index / rate - time.monotonic()))
        token = resume_tokens.token(key, ids[index], "approval")
        url = f"{session.api_url}{resume_tokens.RESUME_PATH}{token}"
        return requests.post(url, json={"ok": True}, timeout=30).status_code

    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(resume, range(len(ids))))
    if set(codes) != {202}:
        raise BenchError(f"resumes answered {sorted(set(codes))}, not only 202")
    _until(
        session,
        "SELECT count(*) FROM steps WHERE step_id = 'next' AND status = 'succeeded'",
        len(ids),
        120,
        "every next step to finish",
    )
    p50, p99, worst, n = session.conn.execute(LATENCY).fetchone()
    return {
        "p50": float(p50),
        "p99": float(p99),
        "max": float(worst),
        "resumes": int(n),
        "rate": rate,
    }


def main() -> None:
    """Measure and print; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--executions", type=int, default=300)
    parser.add_argument("--rate", type=float, default=50.0, help="resumes per second")
    args = parser.parse_args()
    stub = Stub()
    with Session(ADMIN_DATABASE, 2, 8, keep_logs=False, profile_dir=None) as s:
        s.start_api()
        s.start_worker()
        figures = measure(s, stub.url, args.executions, args.rate)
    stub.close()
    print(
        f"resume -> next step started, {figures['resumes']} resumes at {args.rate:g}/s: "
        f"p50 {figures['p50']:.1f} ms, p99 {figures['p99']:.1f} ms, max {figures['max']:.1f} ms"
    )


if __name__ == "__main__":
    main()
