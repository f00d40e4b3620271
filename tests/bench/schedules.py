"""Scheduler figures (issue 13): 1,000 schedules of `every_s: 1` each.

    .venv/bin/python -m tests.bench.schedules [--schedules 1000] [--seconds 20] [--schedulers 1]

Creates a private, migrated database on the local PostgreSQL, publishes `--schedules`
workflows (one transform step, `overlap: allow`, so no execution has to run for the next
tick to fire), and runs `--schedulers` scheduler threads (worker/scheduler.Scheduler,
what each bin/worker runs) for `--seconds`. Prints, from the ledger:

- scheduler lag (a tick's fire time -> its execution created, in the same transaction)
  p50 / p99 / max, over every fired tick after the first two seconds of warm-up;
- ticks decided per second, missed ticks (a lag past the 60 s catch-up window);
- CPU per tick: this process's CPU time (all scheduler threads) divided by the ticks,
  and PostgreSQL's: the CPU time of the server backends serving the bench's database
  (read from /proc, so the server must run on this machine), which leaves out the
  server's shared processes (WAL writer, checkpointer) — the load average is printed
  beside both.

All 1,000 schedules tick at the same instants (every_s counts from the epoch), the worst
case: each second brings 1,000 due rows at once. A figure, not a test: nothing is
asserted; the database is dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import timedelta

import psycopg

from flowforge.domain.definitions import parse_definition
from flowforge.store.db import create_pool
from flowforge.usecases import publishing
from flowforge.worker.scheduler import Scheduler
from tests.bench.infra import migrated_database

ADMIN_URL = os.environ.get(
    "FLOWFORGE_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
WARM_UP_S = 2.0
# Publishing takes seconds, and every schedule is due from its publish: the first tick of
# each is put at the next whole second after the scheduler starts instead, so the
# figures are the steady state of 1,000 schedules, not the catch-up of a publish backlog.
START_AT_NEXT_SECOND = """
UPDATE schedules SET next_tick_at = date_trunc('second', now()) + interval '1 second',
                     fire_at = date_trunc('second', now()) + interval '1 second'
"""
LAG = """
SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY lag_s),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY lag_s), max(lag_s)
FROM schedule_ticks WHERE outcome = 'fired' AND tick_at >= %(since)s AND tick_at < %(until)s
"""
COUNTS = "SELECT outcome, count(*) FROM schedule_ticks GROUP BY outcome ORDER BY outcome"
BACKENDS = """
SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def backend_cpu(pids: list[int]) -> float:
    """CPU seconds (user and system) the server processes `pids` used so far; a backend
    gone meanwhile counts nothing."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    return total


def definition(n: int) -> dict[str, object]:
    return {
        "name": f"tick {n}",
        "trigger": {"schedule": {"every_s": 1, "overlap": "allow", "input": {"n": n}}},
        "steps": [{"id": "a", "type": "transform", "output": "{{ input.n }}"}],
    }


def main() -> None:
    """Measure and print; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedules", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--schedulers", type=int, default=1, help="threads, as workers")
    args = parser.parse_args()
    with migrated_database(ADMIN_URL) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            for n in range(args.schedules):
                document = definition(n)
                publishing.publish(conn, f"tick-{n}", document, parse_definition(document), None)
            # The planner statistics autovacuum would gather soon after such a load (a
            # fresh database has none, and plans the claim as a scan of every schedule);
            # only of the tables just loaded: an empty one analyzed plans as empty.
            conn.execute("ANALYZE workflows, workflow_versions, schedules")
        # Every connection open from the start, so their backends' CPU can be read.
        size = args.schedulers + 1
        pool = create_pool(url, min_size=size, max_size=size, name="bench-scheduler")
        pool.open(wait=True)
        stop = threading.Event()
        threads = [Scheduler(pool, stop) for _ in range(args.schedulers)]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(START_AT_NEXT_SECOND)
            (started_at,) = conn.execute("SELECT now()").fetchone() or (None,)
            pids = [pid for (pid,) in conn.execute(BACKENDS).fetchall()]
            cpu0, wall0, server0 = time.process_time(), time.monotonic(), backend_cpu(pids)
            for thread in threads:
                thread.start()
            time.sleep(args.seconds)
            stop.set()
            for thread in threads:
                thread.join()
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            server = backend_cpu(pids) - server0
            pool.close()
            load = os.getloadavg()
            (ended_at,) = conn.execute("SELECT now()").fetchone() or (None,)
            counts = dict(conn.execute(COUNTS).fetchall())
            window = {
                "since": started_at + timedelta(seconds=WARM_UP_S),
                "until": ended_at - timedelta(seconds=2),
            }
            fired, p50, p99, worst = conn.execute(LAG, window).fetchone() or (0, 0, 0, 0)
        decided = sum(counts.values())
        print(
            f"{args.schedules:,} schedules every_s 1, {args.schedulers} scheduler thread(s), "
            f"{wall:.1f} s on {os.cpu_count()} cores (load average {load[0]:.2f} {load[1]:.2f})"
        )
        print(f"ticks decided: {decided:,} ({decided / wall:,.0f}/s); by outcome: {counts}")
        if fired:
            print(
                f"scheduler lag (fire time -> execution created) over {fired:,} ticks after "
                f"warm-up: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
                f"max {worst * 1000:.1f} ms"
            )
        print(
            f"CPU of the scheduler process: {cpu:.1f} s, {cpu / max(decided, 1) * 1e6:.0f} µs "
            f"per tick; of its PostgreSQL backends: {server:.1f} s, "
            f"{server / max(decided, 1) * 1e6:.0f} µs per tick"
        )


if __name__ == "__main__":
    main()
