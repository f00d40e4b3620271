"""How fast a filter by search attributes answers (docs/contract.md#search-attributes) on a
database of a million executions: `bin/bench --phase attributes` (--quick: 100,000), or

    .venv/bin/python -m tests.bench.attributes [--executions 1000000] [--requests 40]

Creates a private, migrated database on the local PostgreSQL and fills it by SQL
(generate_series, the console bench's executions: tests/bench/console.py), then three
attribute rows per execution, in one INSERT … SELECT from the inputs: `order_id` (unique),
`customer` (one value in 10,000: 100 executions each at a million) and `tier` (one in two).
Then it asks the API's list query (store/timeline.list_executions, what GET
/api/v1/executions?attr.NAME=VALUE and `flowforge executions list --where` run) and the
console's (store/search.page, its list and bulk pages) `--requests` times per filter, and
prints p50 and p99 in ms against the goal of 50 ms. A figure, not a test: nothing is
asserted. The database is dropped afterwards.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

from flowforge.domain.model import ExecutionQuery
from flowforge.store import search, timeline
from flowforge.store.migrate import migrate
from tests.bench.console import ADMIN_URL, FILL, INDEXES, VERSIONS, WORKFLOWS
from tests.bench.infra import PrivateDatabase

GOAL_MS = 50.0
EXECUTIONS = {"quick": 100_000, "full": 1_000_000}
DEFINITION = """{"name": "bench", "trigger": {"webhook": {"auth": "none"}},
 "attributes": {"order_id": "{{ input.order }}", "customer": "{{ input.customer.id }}",
                "tier": "{{ input.tier }}"},
 "steps": [{"id": "shape", "type": "transform", "output": {}}]}"""
ATTRIBUTES = """
INSERT INTO execution_attributes (execution_id, name, value)
SELECT e.id, a.name, a.value
FROM executions e
CROSS JOIN LATERAL (VALUES ('order_id', e.input->>'order'),
                           ('customer', e.input->'customer'->>'id'),
                           ('tier', e.input->>'tier')) AS a(name, value)
"""
ATTRIBUTE_INDEXES = """
SELECT indexname, indexdef FROM pg_indexes
WHERE tablename = 'execution_attributes' AND indexname <> 'execution_attributes_pkey'
"""


def fill(url: str, executions: int, log: Callable[[str], None]) -> None:
    """The executions and their attribute rows, indexes dropped for the fill and rebuilt."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(WORKFLOWS)
        conn.execute(VERSIONS, {"definition": DEFINITION})
        indexes = conn.execute(INDEXES).fetchall() + conn.execute(ATTRIBUTE_INDEXES).fetchall()
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        started = time.monotonic()
        conn.execute(FILL, {"n": executions})
        conn.execute(ATTRIBUTES)
        filled = time.monotonic()
        conn.execute("SET maintenance_work_mem = '256MB'")
        for _, definition in indexes:
            conn.execute(definition)
        conn.execute("VACUUM ANALYZE")
        log(
            f"filled {executions} executions and {3 * executions} attribute rows in "
            f"{filled - started:.1f} s, indexes and vacuum in {time.monotonic() - filled:.1f} s"
        )


def _api(attributes: tuple[tuple[str, str], ...], **fields: Any) -> Callable[[Any], int]:
    query = ExecutionQuery(attributes=attributes, limit=50, **fields)
    return lambda conn: len(timeline.list_executions(conn, query)["items"])


def _console(flt: search.Filter) -> Callable[[Any], int]:
    def ask(conn: Any) -> int:
        with search.bounded(conn):
            return len(search.page(conn, flt, limit=50))

    return ask


def _filters(conn: psycopg.Connection, executions: int) -> dict[str, Callable[[Any], int]]:
    ids = search.workflow_ids(conn, ["wf3"])
    one = str(executions // 2)
    return {
        "api attr.order_id (1 match)": _api((("order_id", one),)),
        "api attr.customer (100 per 1M)": _api((("customer", "42"),)),
        "api attr.tier (half), first page": _api((("tier", "gold"),)),
        "api attr.tier & workflow & failed": _api(
            (("tier", "gold"),), workflow="wf3", status="failed"
        ),
        "api attr.customer & attr.tier": _api((("customer", "42"), ("tier", "gold"))),
        "api attr.order_id (no match)": _api((("order_id", "nope"),)),
        "console where order_id (1 match)": _console(
            search.Filter(attributes=(("order_id", one),))
        ),
        "console where customer & wf3": _console(
            search.Filter(workflow_ids=tuple(ids.values()), attributes=(("customer", "42"),))
        ),
        "console where tier (half)": _console(search.Filter(attributes=(("tier", "gold"),))),
        "console where tier & wf3 & failed": _console(
            search.Filter(
                workflow_ids=tuple(ids.values()),
                statuses=("failed",),
                attributes=(("tier", "gold"),),
            )
        ),
    }


def measure(url: str, executions: int, requests: int) -> dict[str, dict[str, float]]:
    """p50 and p99 (ms) of each filter, asked `requests` times on one connection."""
    found: dict[str, dict[str, float]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for label, ask in _filters(conn, executions).items():
            took, rows = [], 0
            for _ in range(requests):
                started = time.perf_counter()
                rows = ask(conn)
                took.append((time.perf_counter() - started) * 1000)
            quantiles = statistics.quantiles(took, n=100, method="inclusive")
            found[label] = {"p50_ms": quantiles[49], "p99_ms": quantiles[98], "rows": rows}
    return found


def run(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """bin/bench --phase attributes: fill, measure, drop."""
    executions = EXECUTIONS["quick" if args.quick else "full"]
    return _run(getattr(args, "admin_url", ADMIN_URL), executions, 40, log)


def _run(admin_url: str, executions: int, requests: int, log: Callable[[str], None]) -> dict:
    database = PrivateDatabase.create(admin_url)
    try:
        migrate(database.url)
        fill(database.url, executions, log)
        figures = measure(database.url, executions, requests)
    finally:
        database.drop()
    return {"executions": executions, "requests": requests, "filters": figures}


def table(report: dict[str, Any]) -> str:
    """The readable summary."""
    lines = [
        "",
        f"[attributes: filters on {report['executions']:,} executions, "
        f"{report['requests']} asks each; goal p99 <= {GOAL_MS:.0f} ms]",
        f"  {'filter':<38}{'p50 ms':>8}{'p99 ms':>8}{'rows':>6}",
    ]
    for label, r in report["filters"].items():
        flag = "" if r["p99_ms"] <= GOAL_MS else "  over the goal"
        lines.append(f"  {label:<38}{r['p50_ms']:>8.1f}{r['p99_ms']:>8.1f}{r['rows']:>6}{flag}")
    return "\n".join(lines)


def main() -> None:
    """Fill, measure and print; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--executions", type=int, default=EXECUTIONS["full"])
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    print(table(_run(ADMIN_URL, args.executions, args.requests, print)), flush=True)


if __name__ == "__main__":
    main()
