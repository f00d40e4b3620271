"""What FLOWFORGE_SYNC_INTAKE and FLOWFORGE_SYNC_UNSAFE_CLAIMS cost (issue 42).

    python -m tests.bench.sync_commit [--webhooks 200] [--posts 60]

A throwaway primary with a streaming standby named in synchronous_standby_names, the
primary's synchronous_commit `local` (nothing waits unless it asks), the standby behind
a DelayProxy that adds 0, 1 and 5 ms one way. In this process, one at a time:

- intake: `intake.accept` of a webhook, then, with the option, `intake.replicate` before
  the 202 would be given;
- POST step: `Executor.handle` of a ready POST step — claim, request to a local target,
  checkpoint — with the claim's synchronous_commit raised or not.

Prints the mean and p95 per operation and the rate of one sender. Serial on purpose: the
figure is the latency each acknowledgement or request gains; with many senders PostgreSQL
groups the waits (one standby round trip serves every commit in flight).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import psycopg

from flowforge.domain.definitions import parse_definition
from flowforge.steps import netguard
from flowforge.store.db import create_pool
from flowforge.store.migrate import migrate
from flowforge.usecases import intake
from flowforge.usecases.publishing import publish
from flowforge.worker.broker import Wakeup
from flowforge.worker.executor import Executor
from tests.support.replication import Replicated
from tests.support.target import Target

DB = "ff_sync_bench"
DELAYS_MS = (0.0, 1.0, 5.0)


def _timed(count: int, once: Callable[[int], None]) -> tuple[float, float, float]:
    """Mean and p95 in ms, and operations per second, of `count` serial calls."""
    took = []
    began = time.perf_counter()
    for i in range(count):
        start = time.perf_counter()
        once(i)
        took.append((time.perf_counter() - start) * 1000)
    rate = count / (time.perf_counter() - began)
    return statistics.fmean(took), statistics.quantiles(took, n=20)[-1], rate


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.sync_commit")
    parser.add_argument("--webhooks", type=int, default=200)
    parser.add_argument("--posts", type=int, default=60)
    args = parser.parse_args()
    pair = Replicated(synchronous=True, delayed=True)
    target = Target()
    try:
        with psycopg.connect(pair.primary.url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_commit = 'local'")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f"CREATE DATABASE {DB}")
        url = psycopg.conninfo.make_conninfo(pair.primary.url, dbname=DB)
        migrate(url)
        hook = {"name": "hook", "trigger": {"webhook": {"auth": "none"}}, "steps": []}
        hook["steps"] = [{"id": "t", "type": "transform", "output": {"n": "{{ input.n }}"}}]
        pay = {
            "name": "pay",
            "trigger": {"webhook": {"auth": "none"}},
            "steps": [
                {
                    "id": "pay",
                    "type": "http_request",
                    "request": {"method": "POST", "url": f"{target.url}/pay", "json": {}},
                }
            ],
        }
        conn = psycopg.connect(url, autocommit=True)
        for key, raw in (("hook", hook), ("pay", pay)):
            publish(conn, key, raw, parse_definition(raw), None)
        pool = create_pool(url, max_size=2, name="sync-bench")
        pool.open(wait=True, timeout=10)
        assert pair.delay is not None
        print("one-way ms | option | intake mean/p95 ms, per s | POST step mean/p95 ms, per s")
        for delay_ms in DELAYS_MS:
            pair.delay.delay_s = delay_ms / 1000
            time.sleep(0.5)  # chunks already queued keep their old delay
            for level in ("", "on"):
                hooks = intake.Targets()

                def accept(i: int, level: str = level, hooks: intake.Targets = hooks) -> None:
                    found = hooks.get(conn, "hook", None)
                    intake.accept(conn, found, b'{"n": %d}' % i, None, None)
                    if level:
                        intake.replicate(conn, level)

                webhook = _timed(args.webhooks, accept)
                pays = intake.Targets()
                found = pays.get(conn, "pay", None)
                ids = [
                    intake.accept(conn, found, b"{}", None, None).execution_id
                    for _ in range(args.posts)
                ]
                executor = Executor(
                    pool,
                    worker_id="sync-bench",
                    lease_s=30,
                    allow=netguard.Allowlist.parse("127.0.0.1"),
                    secret_bindings={},
                    sync_unsafe_claims=level,
                )
                wakeups = [Wakeup(eid, "pay") for eid in ids]
                step = _timed(args.posts, lambda i, ex=executor, w=wakeups: ex.handle(w[i]))
                print(
                    f"{delay_ms:10.0f} | {level or 'off':6} | "
                    f"{webhook[0]:6.2f}/{webhook[1]:6.2f}, {webhook[2]:6.1f} | "
                    f"{step[0]:6.2f}/{step[1]:6.2f}, {step[2]:6.1f}"
                )
        pool.close()
        conn.close()
    finally:
        target.close()
        pair.stop()


if __name__ == "__main__":
    main()
