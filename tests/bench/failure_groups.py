"""What failure groups cost the failure path (docs/contract.md#failure-groups).

    bin/bench --phase failure_groups [--failures N]   # or: python -m tests.bench.failure_groups

In a database of its own on the local server: N executions of a one-step workflow whose
transform fails (its template reads what the input lacks), each failed by the worker's own
`Executor.handle` of its wake-up (lock, load, render, SAVE_RUN_FAILING or SAVE_RUN, COMMIT),
one at a time, with grouping and without it (store/runs.recorded answering None, so the
unit of work runs SAVE_RUN as before migration 0063). The two modes alternate in blocks of
BLOCK so that the machine's other work falls on both alike; the intake of the executions is
not timed. Prints the mean and p95 per failure of each mode and their ratio (the issue's
bound: at most 1.10). The success path runs SAVE_RUN unchanged: nothing to measure there.

The messages vary (ids, numbers) the way real ones do, and all fall into one group: the
worst case for the group's row, which every failure updates.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import psycopg

from flowforge.domain.definitions import parse_definition
from flowforge.steps import netguard
from flowforge.store import runs
from flowforge.store.db import create_pool
from flowforge.store.migrate import migrate
from flowforge.usecases import intake
from flowforge.usecases.publishing import publish
from flowforge.worker.broker import Wakeup
from flowforge.worker.executor import Executor
from tests.bench.infra import ADMIN_DATABASE

BLOCK = 250
DEFAULT_FAILURES = 2000  # per mode; the 100,000 take too long on a shared machine
WORKFLOW = {
    "name": "fails",
    "trigger": {"webhook": {"auth": "none"}},
    "steps": [{"id": "t", "type": "transform", "output": "{{ input.order.missing.x }}"}],
}


@contextmanager
def _grouping(on: bool) -> Any:
    """Grouping as shipped, or off: runs.recorded answers None (SAVE_RUN, no upsert)."""
    real = runs.recorded
    if not on:
        runs.recorded = lambda _changes: None  # type: ignore[assignment]
    try:
        yield
    finally:
        runs.recorded = real  # type: ignore[assignment]


def _timed(calls: list[Callable[[], None]]) -> list[float]:
    took = []
    for call in calls:
        start = time.perf_counter()
        call()
        took.append((time.perf_counter() - start) * 1000)
    return took


def run(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """Fail `args.failures` executions in each mode; the figures per failure."""
    name = f"ff_fg_bench_{uuid.uuid4().hex[:8]}"
    admin = getattr(args, "admin_url", ADMIN_DATABASE)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = psycopg.conninfo.make_conninfo(admin, dbname=name)
    try:
        return _measure(url, args.failures, log)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _measure(url: str, failures: int, log: Callable[[str], None]) -> dict[str, Any]:
    migrate(url)
    conn = psycopg.connect(url, autocommit=True)
    publish(conn, "fails", WORKFLOW, parse_definition(WORKFLOW), None)
    pool = create_pool(url, max_size=2, name="fg-bench")
    pool.open(wait=True, timeout=10)
    executor = Executor(
        pool,
        worker_id="fg-bench",
        lease_s=30,
        allow=netguard.Allowlist.parse("127.0.0.1"),
        secret_bindings={},
    )
    targets = intake.Targets()
    found = targets.get(conn, "fails", None)
    took: dict[bool, list[float]] = {True: [], False: []}
    try:
        done = 0
        while done < failures:
            for on in (False, True):
                body = b'{"order": {"id": "ord_%d", "n": %d}}'
                ids = [
                    intake.accept(conn, found, body % (done + i, i), None, None).execution_id
                    for i in range(BLOCK)
                ]
                conn.execute("DELETE FROM outbox")  # the wake-ups are handed over below
                with _grouping(on):
                    took[on] += _timed(
                        [lambda eid=eid: executor.handle(Wakeup(eid, "t")) for eid in ids]
                    )
            done += BLOCK
            log(f"failure_groups: {done}/{failures} failures per mode")
        groups = conn.execute("SELECT count(*), sum(count) FROM failure_groups").fetchone()
        failed = conn.execute("SELECT count(*) FROM executions WHERE status = 'failed'").fetchone()
    finally:
        pool.close()
        conn.close()
    off, on = statistics.fmean(took[False]), statistics.fmean(took[True])
    return {
        "failures_per_mode": len(took[True]),
        "without_grouping_ms": {"mean": off, "p95": statistics.quantiles(took[False], n=20)[-1]},
        "with_grouping_ms": {"mean": on, "p95": statistics.quantiles(took[True], n=20)[-1]},
        "ratio": on / off,
        "groups": groups[0],
        "grouped_failures": int(groups[1] or 0),
        "failed_executions": failed[0],
    }


def table(report: dict[str, Any]) -> str:
    """The figures as bin/bench prints them."""
    off, on = report["without_grouping_ms"], report["with_grouping_ms"]
    return "\n".join(
        [
            f"failure path, {report['failures_per_mode']} failures per mode (serial)",
            f"  without grouping  mean {off['mean']:.3f} ms  p95 {off['p95']:.3f} ms",
            f"  with grouping     mean {on['mean']:.3f} ms  p95 {on['p95']:.3f} ms",
            f"  ratio             {report['ratio']:.3f}  (bound 1.10)",
            f"  groups {report['groups']}, grouped failures {report['grouped_failures']}, "
            f"failed executions {report['failed_executions']}",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.failure_groups")
    parser.add_argument("--failures", type=int, default=DEFAULT_FAILURES)
    parser.add_argument("--admin-url", default=ADMIN_DATABASE)
    args = parser.parse_args()
    print(table(run(args, print)))


if __name__ == "__main__":
    main()
