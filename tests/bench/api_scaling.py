"""Intake with 1, 3 and 6 API processes (issue 26): does a second process add intake,
or do commits queue on PostgreSQL's database-wide NOTIFY lock?

    .venv/bin/python -m tests.bench.api_scaling [--seconds 5] [--replication both]

Each figure is its own throwaway PostgreSQL cluster (the local server's settings), one
bin/api with N sync gunicorn workers and wrk with 2 connections per worker posting
webhooks of a three-transform workflow; no bin/worker runs, so only the intake commits.
Besides webhooks/s and latency it samples how many active backends wait on the NOTIFY
lock (a heavyweight lock on `object` pg_database, the one PreCommit_Notify takes).
With `--replication synchronous` the cluster is a primary with a streaming standby
(tests/support/replication.py, synchronous_standby_names = '*'): every commit also waits
for the standby's flush, which a NOTIFY inside the commit would hold its lock through.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading

from tests.bench import load
from tests.bench.infra import ADMIN_DATABASE
from tests.bench.session import CHAIN3, Session
from tests.support.replication import Replicated

PROCESSES = (1, 3, 6)
WAITERS = """
SELECT count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event = 'object'),
       count(*)
FROM pg_stat_activity WHERE state = 'active' AND backend_type = 'client backend'
  AND datname = current_database() AND pid <> pg_backend_pid()
"""


def measure(processes: int, seconds: float, synchronous: bool) -> dict[str, float]:
    """One bin/api with `processes` gunicorn workers, flooded for `seconds`."""
    with contextlib.ExitStack() as stack:
        if synchronous:
            replicated = Replicated(synchronous=True)
            stack.callback(replicated.stop)
            session = Session(replicated.primary.url, processes, 1, False, None)
        else:
            session = Session(ADMIN_DATABASE, processes, 1, False, None, own_postgres=True)
        s = stack.enter_context(session)
        s.start_api()
        s.publish("intake", CHAIN3)
        samples: list[tuple[int, int]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                samples.append(s.conn.execute(WAITERS).fetchone())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        result = load.wrk(s.hook_url("intake"), 2 * processes, seconds, f"p{processes}")
        done.set()
        sampler.join()
        waiting = sum(w for w, _ in samples)
        active = sum(a for _, a in samples)
        return {
            "replication": "synchronous" if synchronous else "none",
            "api_processes": processes,
            "webhooks_per_s": round(result.accepted_per_s, 1),
            "p50_ms": result.latency_p50_ms,
            "p99_ms": result.latency_p99_ms,
            "errors": result.errors,
            "active_waiting_on_notify_lock_pct": round(100 * waiting / active, 1) if active else 0,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--replication", choices=("none", "synchronous", "both"), default="none")
    args = parser.parse_args()
    modes = {"none": (False,), "synchronous": (True,), "both": (False, True)}[args.replication]
    for synchronous in modes:
        for processes in PROCESSES:
            print(json.dumps(measure(processes, args.seconds, synchronous)), flush=True)


if __name__ == "__main__":
    main()
