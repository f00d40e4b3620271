"""The failover matrix, long form (issue 42): every several-hosts fault, rerun and tabled.

    .venv/bin/python -m tests.soak.failover_matrix [--rounds 3] [--only patroni]

Outside CI, like the randomized run's long form: each row is one of the fault tests that
build their own topology on this machine (a primary and a streaming standby, a standby
behind a cut link, Patroni with etcd and HAProxy, three RabbitMQ nodes, worker processes
killed or cut off, an API whose database goes silent), run `--rounds` times in a row.
Each test prints its figures; this script collects them and prints one Markdown table —
the figures of a release for docs/howto/several-hosts.md — with the range of every
number over the rounds and how many rounds passed. Exit status 1 if any round failed.

Partitions by network namespace are not among the rows: every fault here is made with
loopback proxies and signals, which need no privileges beyond those the tests have.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"\d+(?:\.\d+)?")
DASH = "\u2013"  # a range, as the docs write it


@dataclass
class Row:
    """One fault: the test that makes it and the line of figures it prints."""

    fault: str
    test: str
    figures: str  # a regex matching the printed line
    lines: list[str] = field(default_factory=list)
    passed: int = 0
    rounds: int = 0


ROWS = (
    Row(
        "PostgreSQL primary lost, standby promoted, asynchronous",
        "tests/faults/test_failover.py::test_intake_and_work_come_back_after_a_promotion[async]",
        r"^asynchronous: intake back .*",
    ),
    Row(
        "PostgreSQL primary lost, standby promoted, synchronous",
        "tests/faults/test_failover.py::test_intake_and_work_come_back_after_a_promotion[sync]",
        r"^synchronous: intake back .*",
    ),
    Row(
        "link to the standby cut, then primary lost: re-sends and the report",
        "tests/faults/test_failover_resends.py",
        r"^link cut, then primary lost: .*",
    ),
    Row(
        "link cut, then primary lost, FLOWFORGE_SYNC_UNSAFE_CLAIMS / _INTAKE on",
        "tests/faults/test_sync_unsafe.py",
        r"^\d+ POSTs, none twice.*",
    ),
    Row(
        "Patroni: leader host lost, asynchronous",
        "tests/faults/test_patroni.py::test_patroni_promotes_and_haproxy_follows_when_the_leader_is_lost[async]",
        r"^asynchronous: leader lost.*",
    ),
    Row(
        "Patroni: leader host lost, synchronous_mode",
        "tests/faults/test_patroni.py::test_patroni_promotes_and_haproxy_follows_when_the_leader_is_lost[sync]",
        r"^synchronous_mode: leader lost.*",
    ),
    Row(
        "Patroni: switchover under load",
        "tests/faults/test_patroni.py::test_a_switchover_under_load_loses_nothing",
        r"^switchover under load.*",
    ),
    Row(
        "RabbitMQ: quorum queue leader's node killed",
        "tests/faults/test_broker_node_loss.py",
        r"^queue leader .* killed.*",
    ),
    Row(
        "worker host lost (SIGKILL), 120 s lease",
        "tests/faults/test_worker_liveness.py::test_a_killed_workers_long_lease_is_reclaimed_in_seconds",
        r"^SIGKILLed worker's .*",
    ),
    Row(
        "worker cut off from PostgreSQL (blackhole), then a long refusal",
        "tests/faults/test_database_partition.py",
        r"(?!)",  # pass or fail only: it prints no figures
    ),
    Row(
        "API cut off from PostgreSQL (blackhole, direct and behind PgBouncer)",
        "tests/faults/test_database_silent.py",
        r"^\d+ answers during .*",
    ),
)


def run(row: Row) -> None:
    """One round of one row: its test, with its prints kept."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", row.test],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "FLOWFORGE_TEST_PATRONI": "1"},  # tests/faults/test_patroni.py
    )
    row.rounds += 1
    if done.returncode == 0:
        row.passed += 1
    pattern = re.compile(row.figures)
    row.lines += [line.strip() for line in done.stdout.splitlines() if pattern.match(line.strip())]
    status = "passed" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
    print(f"  {row.fault}: {status}", file=sys.stderr, flush=True)
    if done.returncode != 0:
        print(done.stdout[-3000:], file=sys.stderr)


def summary(lines: list[str]) -> str:
    """The lines of all rounds as one: each number becomes its range over the rounds."""
    if not lines:
        return "—"
    shapes = [NUMBER.split(line) for line in lines]
    found = [NUMBER.findall(line) for line in lines]
    numbers = [[float(n) for n in row] for row in found]
    if any(shape != shapes[0] for shape in shapes) or len({len(n) for n in numbers}) != 1:
        return " / ".join(lines)  # the words differ between rounds: show them all
    parts = shapes[0]
    out = [parts[0]]
    for i, text in enumerate(parts[1:]):
        values = [n[i] for n in numbers]
        low, high = min(values), max(values)
        decimals = max(len(row[i].partition(".")[2]) for row in found)  # as printed
        span = (
            f"{low:.{decimals}f}" if low == high else f"{low:.{decimals}f}{DASH}{high:.{decimals}f}"
        )
        out += [span, text]
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.failover_matrix")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="rows whose fault or test contains this")
    args = parser.parse_args(argv)
    rows = [r for r in ROWS if args.only.lower() in (r.fault + r.test).lower()]
    for n in range(args.rounds):
        print(f"round {n + 1} of {args.rounds}", file=sys.stderr, flush=True)
        for row in rows:
            run(row)
    print("| fault | figures (range over the rounds) | rounds passed |")
    print("|---|---|---|")
    for row in rows:
        print(f"| {row.fault} | {summary(row.lines)} | {row.passed} of {row.rounds} |")
    return 0 if all(r.passed == r.rounds for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
