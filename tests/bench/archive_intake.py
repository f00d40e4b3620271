"""What the webhook archive adds to one intake (issue 28 item 5): `python -m
tests.bench.archive_intake` against a migrated database (FLOWFORGE_DATABASE_URL).

intake.accept — the statement bin/api runs for each webhook — in a loop for a workflow
without an archive and one with archive_days 1, rounds alternating so the shared
machine's drift stays out of the comparison; prints the median µs per intake of each.
Run it on a scratch database: it leaves its executions and archived rows there.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import psycopg

from flowforge.domain.definitions import parse_definition
from flowforge.usecases import intake, publishing

PER_ROUND, ROUNDS = 500, 6
STEPS = [{"id": "shape", "type": "transform", "output": {"kind": "{{ input.kind }}"}}]
BODY = json.dumps({"kind": "order.created", "id": "ord_1", "lines": list(range(40))}).encode()
HEADERS = {"Content-Type": "application/json", "webhook-id": "msg_1", "User-Agent": "bench"}


def _round(conn: psycopg.Connection, target: intake.Target) -> float:
    """µs per intake over one round."""
    started = time.perf_counter()
    for _ in range(PER_ROUND):
        intake.accept(conn, target, BODY, None, None, headers=HEADERS)
    return (time.perf_counter() - started) / PER_ROUND * 1e6


def main() -> None:
    """Publish the two workflows, then alternate rounds and print the figures."""
    with psycopg.connect(os.environ["FLOWFORGE_DATABASE_URL"], autocommit=True) as conn:
        targets = {}
        for key, extra in (("bench-plain", {}), ("bench-archived", {"archive_days": 1})):
            doc = {"name": key, "trigger": {"webhook": {"auth": "none"}}, "steps": STEPS, **extra}
            publishing.publish(conn, key, doc, parse_definition(doc), None)
            targets[key] = intake.unsigned_target(conn, key)
        figures: dict[str, list[float]] = {key: [] for key in targets}
        for _ in range(ROUNDS):
            for key, target in targets.items():
                figures[key].append(_round(conn, target))
        for key, values in figures.items():
            print(f"{key}: median {statistics.median(values):.0f} µs per intake {values}")


if __name__ == "__main__":
    main()
