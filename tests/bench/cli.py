"""How long the `flowforge` command takes to answer, as a person at a terminal waits.

    .venv/bin/python -m tests.bench.cli [--runs 20]

Each figure is the wall time of the installed `flowforge` script as a new process (what a
shell and its Tab completion start), measured `--runs` times, printed as p50 and max with
the CPU time it used (p50), next to a bare `python -c pass` on the same machine:
`flowforge --help`, `flowforge completion bash`, and a remote `flowforge executions list`
against a real bin/api (a private, migrated database with 50 queued executions, its own
API key, the API on a loopback port). Issue 43's targets: --help and completion 0.15 s,
the remote list 0.4 s.
A figure, not a test: nothing is asserted. The database is dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psycopg
import requests

from flowforge.store import apikeys
from flowforge.store.migrate import migrate
from tests.bench.infra import PrivateDatabase
from tests.support.definitions import unsigned
from tests.support.processes import start_api

ADMIN_URL = os.environ.get(
    "FLOWFORGE_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
FLOWFORGE = str(Path(sys.executable).parent / "flowforge")
EXECUTIONS = 50
TARGETS_S = {"--help": 0.15, "completion bash": 0.15, "executions list (remote)": 0.4}


def wall_times(
    argv: Sequence[str], env: Mapping[str, str], runs: int
) -> tuple[list[float], list[float]]:
    """Seconds from fork to exit of `argv`, and the CPU seconds it used (user + system,
    which other work on a busy machine inflates far less), `runs` times after one untimed
    warm-up run that fills the page cache, as the second Tab of a session finds it."""
    times, cpu = [], []
    for n in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, timeout=60)
        elapsed = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode()}")
        if n:
            times.append(elapsed)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return times, cpu


def line(name: str, measured: tuple[list[float], list[float]]) -> str:
    times, cpu = measured
    target = TARGETS_S.get(name)
    aim = f"  (target {target:.2f} s)" if target else ""
    return (
        f"{name:<26} p50 {statistics.median(times):.3f} s  max {max(times):.3f} s"
        f"  cpu p50 {statistics.median(cpu):.3f} s  over {len(times)} runs{aim}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")}
    print(line("python -c pass", wall_times([sys.executable, "-c", "pass"], env, args.runs)))
    print(line("--help", wall_times([FLOWFORGE, "--help"], env, args.runs)))
    print(line("completion bash", wall_times([FLOWFORGE, "completion", "bash"], env, args.runs)))

    database = PrivateDatabase.create(ADMIN_URL)
    try:
        migrate(database.url)
        with psycopg.connect(database.url, autocommit=True) as conn:
            _, key = apikeys.create(conn, "bench")
        with tempfile.TemporaryDirectory() as logs:
            api, base = start_api(
                {**env, "FLOWFORGE_DATABASE_URL": database.url}, Path(logs) / "api.log"
            )
            try:
                headers = {"Authorization": f"Bearer {key}"}
                published = requests.post(
                    f"{base}/api/v1/workflows/bench/versions",
                    json=unsigned([{"id": "noop", "type": "transform", "output": {}}]),
                    headers=headers,
                    timeout=10,
                )
                published.raise_for_status()
                for _ in range(EXECUTIONS):  # no worker: they stay queued
                    requests.post(f"{base}/hooks/bench", json={}, timeout=10).raise_for_status()
                remote = {**env, "FLOWFORGE_API_URL": base, "FLOWFORGE_API_KEY": key}
                listing = wall_times([FLOWFORGE, "executions", "list"], remote, args.runs)
                print(line("executions list (remote)", listing))
            finally:
                api.stop()
    finally:
        database.drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
