"""Outbound at scale (SPEC §13, issue 27), against the local PostgreSQL and RabbitMQ:

- slow targets: a backlog of one-request executions, queued before the worker starts,
  drained by one worker at a given concurrency against a target answering after a fixed
  delay; drained/s against concurrency/delay, the worker's PostgreSQL connections against
  its pool, its RSS per request in flight;
- a rate limit of 50/s on one key with 4 workers: the achieved rate (within ±10 %) and
  the most requests that reached the target in any one second (≤ 55).

Run: .venv/bin/python -m tests.bench.outbound [--quick]. Prints each figure, met or NOT met.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pika
import psycopg

from flowforge import apikeys
from flowforge.migrate import migrate
from tests.bench.infra import PrivateDatabase
from tests.support.api import Api
from tests.support.processes import TEST_ENCRYPTION_KEY, TEST_RESUME_KEY, start_api, start_worker
from tests.support.services import LOCAL_AMQP, LOCAL_DATABASE
from tests.support.target import Received, Reply, Target

ADMIN_URL = os.environ.get("FLOWFORGE_TEST_DATABASE_URL") or LOCAL_DATABASE
AMQP_URL = os.environ.get("FLOWFORGE_TEST_AMQP_URL") or LOCAL_AMQP
POOLED = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'flowforge-worker%%'
"""
DONE = "SELECT count(*) FROM executions WHERE status = 'succeeded'"


class Slow:
    """Answers after `delay_s`, counting requests in flight."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.now = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, _request: Received) -> Reply:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.delay_s)
        with self.lock:
            self.now -= 1
        return Reply(json={"ok": True})


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


class Setup:
    """A private database, broker prefix and bin/api for one measurement."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.database = PrivateDatabase.create(ADMIN_URL)
        migrate(self.database.url)
        self.prefix = f"ff_bench_{uuid.uuid4().hex[:10]}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")},
            "FLOWFORGE_DATABASE_URL": self.database.url,
            "FLOWFORGE_AMQP_URL": AMQP_URL,
            "FLOWFORGE_AMQP_PREFIX": self.prefix,
            "FLOWFORGE_HTTP_ALLOW": "127.0.0.1",
            "FLOWFORGE_ENCRYPTION_KEY": TEST_ENCRYPTION_KEY,
            "FLOWFORGE_RESUME_KEY": TEST_RESUME_KEY,
            "FLOWFORGE_LOG_LEVEL": "INFO",
        }
        self.db = psycopg.connect(self.database.url, autocommit=True)
        self.api_proc, base = start_api(self.env, folder / "api.log", workers=4)
        self.api = Api(base, apikeys.create(self.db, "bench")[1])
        self.workers: list[Any] = []

    def backlog(self, workflow: str, definition: dict[str, Any], count: int) -> None:
        self.api.publish(workflow, definition)
        with ThreadPoolExecutor(16) as starters:
            list(starters.map(lambda n: self.api.start(workflow, {"n": n}), range(count)))

    def worker(self, **extra: str) -> Any:
        log = self.folder / f"worker-{len(self.workers)}.log"
        proc = start_worker({**self.env, **extra}, log)
        self.workers.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.workers:
            proc.stop()
        self.api_proc.stop()
        self.db.close()
        self.database.drop()
        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        channel = connection.channel()
        for queue in (f"{self.prefix}.steps", f"{self.prefix}.dead"):
            channel.queue_delete(queue)
        for exchange in (self.prefix, f"{self.prefix}.dlx"):
            channel.exchange_delete(exchange)
        connection.close()


def slow_target(folder: Path, concurrency: int, delay_s: float, count: int, pool: int) -> None:
    setup = Setup(folder)
    target = Target()
    slow = Slow(delay_s)
    target.script = slow
    try:
        call = {"id": "call", "type": "http_request", "request": {"url": f"{target.url}/s"}}
        definition = {"name": "slow", "trigger": {"webhook": {"auth": "none"}}, "steps": [call]}
        setup.backlog("slow", definition, count)
        started = time.monotonic()
        worker = setup.worker(
            FLOWFORGE_WORKER_CONCURRENCY=str(concurrency), FLOWFORGE_WORKER_POOL_SIZE=str(pool)
        )
        most_connections = most_rss = 0
        rss_at_peak = 0
        first = None
        while (done := setup.db.execute(DONE).fetchone()[0]) < count:
            if first is None and done:
                first = time.monotonic()
            most_connections = max(most_connections, setup.db.execute(POOLED).fetchone()[0])
            rss = rss_kib(worker.pid)
            if slow.now >= slow.most * 0.9 and rss > most_rss:
                most_rss, rss_at_peak = rss, slow.now
            time.sleep(0.05)
        elapsed = time.monotonic() - (first or started)
        rate = count / elapsed
        ideal = concurrency / delay_s
        print(f"slow target {delay_s:g} s, concurrency {concurrency}, {count} executions:")
        print(
            f"  drained/s {rate:.1f} vs ideal {ideal:.0f}: at least 0.8 x ideal "
            f"{verdict(rate >= 0.8 * ideal)}"
        )
        print(f"  most in flight {slow.most}")
        print(
            f"  worker PostgreSQL connections {most_connections} ≤ pool {pool} + 1 (listen): "
            f"{verdict(most_connections <= pool + 1)}"
        )
        if rss_at_peak:
            print(
                f"  worker RSS {most_rss / 1024:.0f} MiB at {rss_at_peak} in flight: "
                f"{most_rss / rss_at_peak:.0f} KiB per request in flight (incl. the base)"
            )
    finally:
        target.close()
        setup.close()


def rate_limit(folder: Path, rate: int, workers: int, count: int) -> None:
    setup = Setup(folder)
    target = Target()
    try:
        call = {
            "id": "call",
            "type": "http_request",
            "limit": "partner",
            "request": {"url": f"{target.url}/r"},
        }
        definition = {
            "name": "rated",
            "trigger": {"webhook": {"auth": "none"}},
            "limits": {"partner": {"rate_per_s": rate}},
            "steps": [call],
        }
        setup.backlog("rated", definition, count)
        for _ in range(workers):
            setup.worker(FLOWFORGE_WORKER_CONCURRENCY="32")
        while setup.db.execute(DONE).fetchone()[0] < count:
            time.sleep(0.2)
        times = sorted(r.at for r in target.received)
        achieved = (len(times) - 1) / (times[-1] - times[0])
        most, first = 0, 0
        for last, at in enumerate(times):
            while at - times[first] >= 1.0:
                first += 1
            most = max(most, last - first + 1)
        print(f"rate limit {rate}/s, {workers} workers, {count} executions:")
        print(
            f"  achieved {achieved:.1f}/s: within ±10 % "
            f"{verdict(abs(achieved - rate) <= rate * 0.1)}"
        )
        print(f"  most in any second {most}: ≤ {rate * 1.1:.0f} {verdict(most <= rate * 1.1)}")
    finally:
        target.close()
        setup.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="concurrency 256 at 0.2 s only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ff-bench-outbound-") as folder:
        root = Path(folder)
        runs = (
            [(256, 0.2, 1500)]
            if args.quick
            else [(256, 0.2, 2500), (256, 1.0, 1000), (1000, 0.2, 5000), (1000, 1.0, 3000)]
        )
        for n, (concurrency, delay, count) in enumerate(runs):
            (root / f"slow{n}").mkdir()
            slow_target(root / f"slow{n}", concurrency, delay, count, pool=10)
        (root / "rate").mkdir()
        rate_limit(root / "rate", 50, 4, 300 if args.quick else 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
