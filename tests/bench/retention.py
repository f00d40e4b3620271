"""Soak: the database stays flat while executions keep coming, thanks to retention.

    .venv/bin/python -m tests.bench.retention [--executions 200000] [--retention-min 3]
        [--report-s 30] [--workers 2] [--senders 4] [--max-backlog 2000] [--vacuum-s 60]
    .venv/bin/python -m tests.bench.retention --delete-only 100000

Starts bin/api and `--workers` bin/worker processes in a private database and RabbitMQ
vhost (tests/bench session), publishes three chained transforms with `retention_days`
of `--retention-min` minutes, and sends `--executions` webhooks through the real
webhook → relay → RabbitMQ → worker path, as fast as the worker keeps up (sending pauses
while more than `--max-backlog` steps wait to run, so the figures show retention, not a
growing queue). The workers' own housekeeping deletes what is past its retention. Every
`--report-s` seconds and at the end it prints the row counts and pg_total_relation_size
of executions, steps, attempts, execution_events and idempotency_keys.

The webhooks carry no Idempotency-Key: an execution with a key is kept as long as its key
(FLOWFORGE_IDEMPOTENCY_KEY_HOURS, at least an hour), so with keys a soak of minutes would
measure the key lifetime, not retention (tests/bench/idempotency_cleanup.py measures that
cleanup). PostgreSQL reuses the space of deleted rows only once they are vacuumed; this
machine's server runs with autovacuum off, so the soak runs a plain VACUUM of those tables
every `--vacuum-s` seconds (0: never), which is what autovacuum does in production. A
figure, not a test: nothing is asserted.

`--delete-only N` measures retention's own pace instead: N expired executions shaped like
chain3's (three steps, three attempts, eight events each) are bulk-inserted into a private
database, and the housekeeping's Retention deletes them pass after pass; it prints
executions deleted per second, to hold against intake's rate.
"""

from __future__ import annotations

import argparse
import http.client
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import psycopg

from flowforge.store.db import create_pool
from flowforge.store.migrate import migrate
from flowforge.worker.retention import Retention
from tests.bench.infra import ADMIN_DATABASE, BenchError, PrivateDatabase
from tests.bench.session import CHAIN3, Interrupted, Session

TABLES = ("executions", "steps", "attempts", "execution_events", "idempotency_keys")
BODY = b'{"order_id": "A-1001", "total": 250}'
# Steps waiting for a worker: through the partial index steps_ready, never a table scan.
BACKLOG = "SELECT count(*) FROM steps WHERE status = 'ready'"
SIZES = "SELECT " + ", ".join(
    f"(SELECT count(*) FROM {t}), pg_total_relation_size('{t}')" for t in TABLES
)


class Senders:
    """Threads that POST webhooks while the backlog is small, until `total` were accepted."""

    def __init__(self, url: str, total: int, threads: int) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname or "127.0.0.1", parts.port, parts.path
        self.total = total
        self.open = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.accepted = 0
        self.refused = 0
        self.threads = [
            threading.Thread(target=self._send, name=f"sender-{i}", daemon=True)
            for i in range(threads)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def done(self) -> bool:
        with self.lock:
            return self.accepted >= self.total

    def _send(self) -> None:
        while not self.stop.is_set() and not self.done():
            if not self.open.wait(0.2):
                continue
            # gunicorn's sync workers close every connection: one per request.
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            try:
                conn.request(
                    "POST", self.path, body=BODY, headers={"Content-Type": "application/json"}
                )
                response = conn.getresponse()
                response.read()
                status = response.status
            except OSError:
                status = 0
            finally:
                conn.close()
            with self.lock:
                if status == 202:
                    self.accepted += 1
                else:
                    self.refused += 1


def _mb(size: int) -> str:
    return f"{size / 1e6:7.1f} MB"


def report(conn: psycopg.Connection, started: float, senders: Senders, note: str = "") -> dict:
    """Print one line of figures; return them."""
    row = conn.execute(SIZES).fetchone()
    figures: dict[str, Any] = {
        "t_s": round(time.monotonic() - started),
        "accepted": senders.accepted,
        "backlog": conn.execute(BACKLOG).fetchone()[0],
        "database_bytes": conn.execute("SELECT pg_database_size(current_database())").fetchone()[0],
    }
    for i, table in enumerate(TABLES):
        figures[table] = {"rows": row[2 * i], "bytes": row[2 * i + 1]}
    tables = "  ".join(f"{t} {figures[t]['rows']:>7,} {_mb(figures[t]['bytes'])}" for t in TABLES)
    rate = senders.accepted / max(1, figures["t_s"])
    print(
        f"t={figures['t_s']:>5}s accepted {senders.accepted:>7,} ({rate:4.0f}/s) "
        f"backlog {figures['backlog']:>5,} db {_mb(figures['database_bytes'])} | {tables}"
        + (f"  [{note}]" if note else ""),
        flush=True,
    )
    return figures


def soak(args: argparse.Namespace) -> list[dict]:
    """Run the soak; returns every report."""
    reports: list[dict] = []
    with Session(ADMIN_DATABASE, 2, 4, keep_logs=False, profile_dir=None) as s:
        s.start_api()
        days = args.retention_min / 1440
        s.publish("chain3", {**CHAIN3, "retention_days": days})
        workers = [s.start_worker() for _ in range(args.workers)]
        print(
            f"soak: {args.executions:,} executions of chain3 (3 transforms), retention_days "
            f"{days:.6f} ({args.retention_min:g} min), {args.workers} worker(s), database "
            f"{s.db.name}, VACUUM every {args.vacuum_s or 'never'} s",
            flush=True,
        )
        senders = Senders(s.hook_url("chain3"), args.executions, args.senders)
        vacuum = psycopg.connect(s.db.url, autocommit=True)
        s.stack.callback(vacuum.close)
        started = time.monotonic()
        senders.start()
        next_report = next_vacuum = started
        try:
            while not senders.done():
                now = time.monotonic()
                backlog = s.scalar(BACKLOG)
                if backlog > args.max_backlog:
                    senders.open.clear()
                else:
                    senders.open.set()
                if args.vacuum_s and now >= next_vacuum:
                    vacuum.execute("VACUUM " + ", ".join(TABLES))
                    next_vacuum = now + args.vacuum_s
                if now >= next_report:
                    reports.append(report(s.conn, started, senders))
                    next_report = now + args.report_s
                if not all(worker.alive() for worker in workers):
                    raise BenchError("a bin/worker died during the soak")
                time.sleep(0.2)
        finally:
            senders.stop.set()
        while s.scalar(BACKLOG):
            time.sleep(0.5)
        reports.append(report(s.conn, started, senders, "all sent and run"))
        # One retention window and a housekeeping pass later, nearly everything is gone.
        settle_until = time.monotonic() + args.retention_min * 60 + 75
        while time.monotonic() < settle_until:
            time.sleep(min(args.report_s, max(0.0, settle_until - time.monotonic())))
            if args.vacuum_s:
                vacuum.execute("VACUUM " + ", ".join(TABLES))
            reports.append(report(s.conn, started, senders, "settling"))
        if senders.refused:
            print(f"soak: {senders.refused} webhooks were not accepted", flush=True)
        failed = s.scalar("SELECT count(*) FROM executions WHERE status <> 'succeeded'")
        print(f"soak: {failed} executions left that did not succeed", flush=True)
    return reports


# Finished chain3 executions, as the worker leaves them, an hour past a minute's retention.
EXPIRED = """
WITH w AS (
    INSERT INTO workflows (key, latest_version) VALUES ('chain3', 1) RETURNING id
), v AS (
    INSERT INTO workflow_versions (workflow_id, version, name, definition, webhook_auth)
    SELECT id, 1, 'chain3', '{"retention_days": 0.0007}', 'none' FROM w RETURNING id, workflow_id
)
INSERT INTO executions (id, workflow_id, version_id, status, input, created_at, started_at,
                        finished_at)
SELECT gen_random_uuid(), v.workflow_id, v.id, 'succeeded', '{"order_id": "A-1"}',
       now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
FROM v, generate_series(1, %(n)s)
"""
EXPIRED_CHILDREN = [
    """INSERT INTO steps (execution_id, step_id, type, position, status, output, started_at,
                          finished_at)
       SELECT e.id, s.id, 'transform', s.n, 'succeeded', '{"order": "A-1"}', e.started_at,
              e.finished_at
       FROM executions e, (VALUES ('a', 1), ('b', 2), ('c', 3)) AS s(id, n)""",
    """INSERT INTO attempts (execution_id, step_id, attempt, fencing_token, outcome, finished_at)
       SELECT execution_id, step_id, 1, 1, 'succeeded', finished_at FROM steps""",
    """INSERT INTO execution_events (execution_id, step_id, kind, detail)
       SELECT e.id, NULL, 'execution.succeeded', '{"to": "succeeded"}'
       FROM executions e, generate_series(1, 8)""",
]


def delete_only(count: int) -> None:
    """Time Retention over `count` expired executions; see the module docstring."""
    db = PrivateDatabase.create(ADMIN_DATABASE)
    try:
        migrate(db.url)
        with psycopg.connect(db.url, autocommit=True) as conn:
            conn.execute(EXPIRED, {"n": count})
            for statement in EXPIRED_CHILDREN:
                conn.execute(statement)
            conn.execute("VACUUM ANALYZE")
            rows = sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES)
        pool = create_pool(db.url, max_size=2, name="bench-retention")
        pool.open(wait=True, timeout=30)
        retention = Retention(pool, threading.Event())
        started = time.monotonic()
        deleted, passes, caught_up = 0, 0, False
        while not caught_up:
            gone, caught_up = retention.expire()
            deleted += gone
            passes += 1
        elapsed = time.monotonic() - started
        pool.close()
        print(
            f"retention deleted {deleted:,} executions ({rows:,} rows with their steps, attempts "
            f"and events) in {elapsed:.1f} s over {passes} passes: {deleted / elapsed:,.0f} "
            f"executions/s, {rows / elapsed:,.0f} rows/s",
            flush=True,
        )
    finally:
        db.drop()


def main() -> int:
    """Run and print; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--executions", type=int, default=200_000)
    parser.add_argument("--retention-min", type=float, default=3.0)
    parser.add_argument("--report-s", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--max-backlog", type=int, default=2000)
    parser.add_argument("--vacuum-s", type=float, default=60.0)
    parser.add_argument("--delete-only", type=int, default=0, metavar="N")
    args = parser.parse_args()
    try:
        if args.delete_only:
            delete_only(args.delete_only)
        else:
            soak(args)
    except BenchError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Interrupted):
        print("soak: interrupted; everything it started was stopped and removed", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
