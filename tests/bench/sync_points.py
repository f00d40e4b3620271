"""What it costs to leave the server, at every moment, in a state a timeout covers.

    .venv/bin/python -m tests.bench.sync_points [--units 2000]

A unit of work's shape, on a private database: BEGIN, lock a row and read (fetched),
then two writes and COMMIT — as a claim (executor._take) and a checkpoint
(executor._checkpoint) are. Three ways to pipeline it, each timed over `--units` units
on one connection in 5 interleaved rounds (medians), with the client's CPU per unit:

- `flush per statement`: psycopg's own pipeline (before issue 39): two round trips, but
  each statement is written as soon as it is executed, so a client frozen after a write
  leaves the server `active` holding the lock, which no timeout ends;
- `sync per statement`: a Sync after every statement, so the server is `idle in
  transaction` after each — one round trip per statement;
- `one write per round trip` (db.SyncedPipeline, what FlowForge does): nothing is sent
  until a Sync, then the round trip in one write: two round trips, two writes.

A figure, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg

from flowforge.store.db import DeadlineConnection
from tests.bench.infra import PrivateDatabase

ROUNDS = 5
ADMIN_URL = "postgresql://root@127.0.0.1:5432/postgres"
SETUP = """
CREATE TABLE units (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
CREATE TABLE events (unit int, n bigint, at timestamptz DEFAULT now());
INSERT INTO units (id) SELECT generate_series(1, 100);
"""
LOCK = "SELECT id, n FROM units WHERE id = %(id)s FOR UPDATE"
UPDATE = "UPDATE units SET n = n + 1 WHERE id = %(id)s"
INSERT = "INSERT INTO events (unit, n) VALUES (%(id)s, %(n)s)"


def _unit(conn: psycopg.Connection[Any], i: int, sync_each: bool) -> None:
    params = {"id": i % 100 + 1}
    with conn.pipeline() as pipeline:
        conn.execute("BEGIN")
        row = conn.execute(LOCK, params).fetchone()
        assert row is not None
        for statement, values in ((UPDATE, params), (INSERT, {**params, "n": row[1]})):
            conn.execute(statement, values)
            if sync_each:
                pipeline.sync()
        conn.execute("COMMIT")


def _measure(url: str, units: int, held: bool, sync_each: bool) -> tuple[float, float]:
    """Microseconds of wall clock and of this process's CPU per unit."""
    kind = DeadlineConnection if held else psycopg.Connection  # its pipeline: SyncedPipeline
    with kind.connect(url, autocommit=True) as conn:
        for i in range(200):  # warm up: prepared statements, caches
            _unit(conn, i, sync_each)
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(units):
            _unit(conn, i, sync_each)
        return (
            (time.perf_counter() - wall) / units * 1e6,
            (time.process_time() - cpu) / units * 1e6,
        )


def main() -> None:
    """Measure and print; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--units", type=int, default=2000)
    args = parser.parse_args()
    database = PrivateDatabase.create(ADMIN_URL)
    try:
        with psycopg.connect(database.url, autocommit=True) as conn:
            conn.execute(SETUP)
        ways = (
            ("flush per statement", False, False),
            ("sync per statement", False, True),
            ("one write per round trip", True, False),
        )
        # Interleaved rounds, medians: the machine is shared, so its noise falls on all.
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in ways}
        for _ in range(ROUNDS):
            for name, held, sync_each in ways:
                figures[name].append(_measure(database.url, args.units, held, sync_each))
        for name, measured in figures.items():
            wall_us = statistics.median(w for w, _ in measured)
            cpu_us = statistics.median(c for _, c in measured)
            print(f"{name:>26}: {wall_us:6.0f} µs per unit, {cpu_us:5.0f} µs client CPU")
    finally:
        database.drop()


if __name__ == "__main__":
    main()
