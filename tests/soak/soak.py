"""Soak: hundreds of executions through several workers while workers are SIGKILLed and
restarted and the broker is stopped and started, then FlowForge's invariants are checked.

Not collected by pytest (no test_ prefix); run it by hand or on a schedule:

    .venv/bin/python -m tests.soak.soak --executions 300 --workers 2

It creates and drops its own database and RabbitMQ names (like the tests) on the local
PostgreSQL and RabbitMQ, or on FLOWFORGE_TEST_DATABASE_URL / FLOWFORGE_TEST_AMQP_URL.
`rabbitmqctl stop_app` stops the local broker for everyone on the box: keep
--broker-restarts small (0 to skip) on a shared machine. Exit status 0 means zero
invariant violations.

Invariants:
1. every accepted webhook (202) has exactly one execution, the one its answer named;
2. every execution ends terminal or needs_attention;
3. no unsafe request (POST without idempotency key) reached the target twice;
4. no step succeeded twice (at most one attempt with outcome succeeded per step);
plus two consistency checks: a succeeded execution's unsafe POST reached the target
exactly once, and repeated idempotent POSTs always carried the same Idempotency-Key.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import psycopg
import requests

from flowforge import apikeys
from flowforge.migrate import migrate
from tests.support.api import TERMINAL, Api
from tests.support.processes import Process, start_api, start_worker, wait_for
from tests.support.services import LOCAL_AMQP, LOCAL_DATABASE
from tests.support.target import Received, Reply, Target

WORKFLOW = "soak"


def definition(target: Target) -> dict[str, Any]:
    """lookup (GET) → charge (unsafe POST) → pause (1 s delay) → shape → notify (keyed POST)."""
    return {
        "name": "Soak",
        "trigger": {"webhook": {"auth": "none"}},
        "steps": [
            {
                "id": "lookup",
                "type": "http_request",
                "request": {"method": "GET", "url": f"{target.url}/lookup/{{{{ input.n }}}}"},
                "retry": {"max_attempts": 5, "initial_interval_s": 0.2},
            },
            {
                "id": "charge",
                "type": "http_request",
                "depends_on": ["lookup"],
                "request": {
                    "method": "POST",
                    "url": f"{target.url}/charge/{{{{ execution.id }}}}",
                    "json": {"total": "{{ lookup.body.total }}"},
                },
            },
            {"id": "pause", "type": "delay", "duration_s": 1, "depends_on": ["charge"]},
            {
                "id": "shape",
                "type": "transform",
                "depends_on": ["pause"],
                "output": {"charge": "{{ charge.body.id }}", "n": "{{ input.n }}"},
            },
            {
                "id": "notify",
                "type": "http_request",
                "depends_on": ["shape"],
                "request": {
                    "method": "POST",
                    "url": f"{target.url}/notify/{{{{ execution.id }}}}",
                    "json": "{{ shape }}",
                    "idempotency_key": "{{ execution.id }}-notify",
                },
                "retry": {"max_attempts": 5, "initial_interval_s": 0.2},
            },
        ],
    }


def answer(rng: random.Random) -> Callable[[Received], Reply]:
    """The target: small random latencies, and an occasional 503 on the keyed POST."""
    lock = threading.Lock()

    def script(req: Received) -> Reply:
        with lock:
            delay = rng.uniform(0, 0.3)
            flaky = rng.random() < 0.1
        if req.path.startswith("/lookup/"):
            return Reply(json={"total": int(req.path.rsplit("/", 1)[1])}, delay_s=delay)
        if req.path.startswith("/charge/"):
            return Reply(json={"id": f"ch_{uuid.uuid4().hex[:8]}"}, delay_s=delay)
        if req.path.startswith("/notify/") and flaky:
            return Reply(status=503, json={"error": "busy"})
        return Reply(json={"ok": True}, delay_s=delay)

    return script


@dataclass
class Soak:
    """One soak run: its services, its processes, and what it saw."""

    args: argparse.Namespace
    admin_url: str
    amqp_url: str
    logs: Path
    rng: random.Random
    database: str = field(default_factory=lambda: f"ff_soak_{uuid.uuid4().hex[:10]}")
    prefix: str = field(default_factory=lambda: f"ff_soak_{uuid.uuid4().hex[:10]}")
    workers: list[Process] = field(default_factory=list)
    accepted: dict[str, str] = field(default_factory=dict)
    replays: int = 0
    replay_mismatches: list[str] = field(default_factory=list)
    rejected: Counter[int] = field(default_factory=Counter)
    kills: int = 0
    broker_restarts: int = 0
    started_workers: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def database_url(self) -> str:
        return psycopg.conninfo.make_conninfo(self.admin_url, dbname=self.database)

    def env(self) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")},
            "FLOWFORGE_DATABASE_URL": self.database_url,
            "FLOWFORGE_AMQP_URL": self.amqp_url,
            "FLOWFORGE_AMQP_PREFIX": self.prefix,
            "FLOWFORGE_LEASE_SECONDS": str(self.args.lease),
            "FLOWFORGE_RECONCILE_SECONDS": "2",
            "FLOWFORGE_HTTP_ALLOW": "127.0.0.1",
            "FLOWFORGE_WORKER_CONCURRENCY": "4",
        }

    # ---- processes -------------------------------------------------------------------

    def start_worker(self) -> Process:
        self.started_workers += 1
        proc = start_worker(self.env(), self.logs / f"worker-{self.started_workers}.log")
        self.workers.append(proc)
        return proc

    def live_workers(self) -> list[Process]:
        return [w for w in self.workers if w.popen.poll() is None]

    # ---- load ------------------------------------------------------------------------

    def send(self, base: str, n: int) -> None:
        """Deliver event n until it is accepted; sometimes deliver it twice, as senders do."""
        key = f"soak-{n}"
        body = {"n": n}
        for _ in range(200):
            try:
                r = requests.post(
                    f"{base}/hooks/{WORKFLOW}",
                    json=body,
                    headers={"Idempotency-Key": key},
                    timeout=15,
                )
            except requests.RequestException:
                time.sleep(0.2)
                continue
            if r.status_code == 202:
                eid = r.json()["execution_id"]
                with self.lock:
                    previous = self.accepted.setdefault(key, eid)
                    if previous != eid:
                        self.replay_mismatches.append(key)
                break
            with self.lock:
                self.rejected[r.status_code] += 1
            time.sleep(0.2)
        if self.rng.random() < self.args.duplicates:
            r = requests.post(
                f"{base}/hooks/{WORKFLOW}", json=body, headers={"Idempotency-Key": key}, timeout=15
            )
            with self.lock:
                self.replays += 1
                if r.status_code != 202 or r.json()["execution_id"] != self.accepted.get(key):
                    self.replay_mismatches.append(key)

    def chaos(self, stop: threading.Event) -> None:
        """SIGKILL a random worker and start a replacement; now and then, restart the broker."""
        restarts_left = self.args.broker_restarts
        rounds = 0
        while not stop.wait(self.rng.uniform(*self.args.chaos_interval)):
            rounds += 1
            if restarts_left and rounds % 4 == 0:
                restarts_left -= 1
                self.restart_broker()
                continue
            live = self.live_workers()
            if live:
                victim = self.rng.choice(live)
                victim.kill()
                self.kills += 1
            self.start_worker()

    def restart_broker(self) -> None:
        """stop_app, a short outage, start_app — always started again."""
        subprocess.run(["rabbitmqctl", "-q", "stop_app"], check=True, timeout=120)
        try:
            time.sleep(self.args.broker_outage)
        finally:
            subprocess.run(["rabbitmqctl", "-q", "start_app"], check=True, timeout=120)
            subprocess.run(
                ["rabbitmqctl", "-q", "await_startup", "--timeout", "120"], check=True, timeout=180
            )
        self.broker_restarts += 1

    # ---- the run ---------------------------------------------------------------------

    def run(self) -> int:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        target = Target()
        # Killed workers reset their connections to the target: expected here, not news.
        target.server.handle_error = lambda *_args: None  # type: ignore[method-assign]
        api_proc: Process | None = None
        try:
            migrate(self.database_url)
            with psycopg.connect(self.database_url, autocommit=True) as conn:
                key = apikeys.create(conn, "soak")[1]
            api_proc, base = start_api(self.env(), self.logs / "api.log", workers=3)
            client = Api(base, key)
            target.script = answer(random.Random(self.rng.random()))
            client.publish(WORKFLOW, definition(target))
            for _ in range(self.args.workers):
                self.start_worker()
            return self.drive(client, base, target)
        finally:
            for proc in self.workers:
                proc.stop()
            if api_proc is not None:
                api_proc.stop()
            target.close()
            if not self.args.keep:
                self.cleanup()

    def drive(self, client: Api, base: str, target: Target) -> int:
        started = time.monotonic()
        stop_chaos = threading.Event()
        chaos = threading.Thread(target=self.chaos, args=(stop_chaos,), daemon=True)
        chaos.start()
        interval = 1.0 / self.args.rate
        with ThreadPoolExecutor(8) as pool:
            futures = []
            for n in range(self.args.executions):
                futures.append(pool.submit(self.send, base, n))
                time.sleep(interval)
            for future in futures:
                future.result()
        sent_s = time.monotonic() - started
        # Keep the chaos going a little after the last webhook, then let the workers finish.
        time.sleep(self.args.chaos_tail)
        stop_chaos.set()
        chaos.join()
        if len(self.live_workers()) < 2:
            self.start_worker()
        settled = self.settle()
        total_s = time.monotonic() - started
        return self.check(target, sent_s, total_s, settled)

    def settle(self) -> bool:
        """Wait until no execution is live any more."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:

            def quiet() -> bool:
                (live,) = conn.execute(
                    "SELECT count(*) FROM executions WHERE status <> ALL(%(done)s)",
                    {"done": list(TERMINAL)},
                ).fetchone()
                return live == 0

            try:
                wait_for(quiet, timeout=self.args.timeout, interval=0.5, message="settle")
                return True
            except AssertionError:
                return False

    def check(self, target: Target, sent_s: float, total_s: float, settled: bool) -> int:
        violations: list[str] = []
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            by_key: dict[str, list[str]] = {}
            for k, eid in conn.execute("SELECT idempotency_key, id FROM executions"):
                by_key.setdefault(k, []).append(str(eid))
            statuses = Counter(
                dict(conn.execute("SELECT status, count(*) FROM executions GROUP BY 1"))
            )
            twice = conn.execute(
                "SELECT execution_id, step_id, count(*) FROM attempts "
                "WHERE outcome = 'succeeded' GROUP BY 1, 2 HAVING count(*) > 1"
            ).fetchall()
            succeeded = {
                str(r[0])
                for r in conn.execute("SELECT id FROM executions WHERE status = 'succeeded'")
            }
            outcomes = Counter(
                dict(
                    conn.execute(
                        "SELECT coalesce(outcome, 'in flight'), count(*) FROM attempts GROUP BY 1"
                    )
                )
            )
            unknown_steps = Counter(
                dict(
                    conn.execute(
                        "SELECT step_id, count(*) FROM steps WHERE status = 'unknown' GROUP BY 1"
                    )
                )
            )

        # 1. every accepted webhook has exactly one execution, the one it was told about
        for key, eid in self.accepted.items():
            if by_key.get(key) != [eid]:
                violations.append(f"webhook {key}: answered {eid}, executions {by_key.get(key)}")
        extra = set(by_key) - set(self.accepted)
        if extra:
            violations.append(f"{len(extra)} executions without an accepted webhook")
        if self.replay_mismatches:
            violations.append(f"replays answered a different execution: {self.replay_mismatches}")
        # 2. every execution ends terminal or needs_attention
        live = {s: c for s, c in statuses.items() if s not in TERMINAL}
        if live or not settled:
            violations.append(f"executions still live: {live}")
        # 3. no unsafe request reached the target twice
        charges = Counter(r.path for r in target.requests_to("/charge/"))
        repeated = {p: c for p, c in charges.items() if c > 1}
        if repeated:
            violations.append(f"unsafe POSTs sent more than once: {repeated}")
        # 4. no step succeeded twice
        if twice:
            violations.append(f"steps that succeeded twice: {twice}")
        # consistency: a succeeded execution's charge was sent exactly once
        unsent = [eid for eid in succeeded if charges.get(f"/charge/{eid}") != 1]
        if unsent:
            violations.append(f"succeeded without exactly one charge: {unsent[:5]}")
        keys: dict[str, set[str]] = {}
        for r in target.requests_to("/notify/"):
            keys.setdefault(r.path, set()).add(r.headers.get("idempotency-key", ""))
        mixed = {p: k for p, k in keys.items() if len(k) != 1}
        if mixed:
            violations.append(f"keyed POSTs with differing Idempotency-Key: {mixed}")

        notify_counts = Counter(r.path for r in target.requests_to("/notify/"))
        lookups = Counter(r.path for r in target.requests_to("/lookup/"))
        figures = {
            "executions_accepted": len(self.accepted),
            "duplicate_deliveries": self.replays,
            "non_202_answers": dict(self.rejected),
            "statuses": dict(statuses),
            "unknown_steps": dict(unknown_steps),
            "workers_started": self.started_workers,
            "workers_sigkilled": self.kills,
            "broker_restarts": self.broker_restarts,
            "attempt_outcomes": dict(outcomes),
            "target_requests": len(target.received),
            "lookup_get_repeats": sum(c - 1 for c in lookups.values()),
            "notify_keyed_post_repeats": sum(c - 1 for c in notify_counts.values()),
            "unsafe_post_max_per_execution": max(charges.values(), default=0),
            "sending_s": round(sent_s, 1),
            "total_s": round(total_s, 1),
            "violations": len(violations),
        }
        print(json.dumps(figures, indent=2))
        for violation in violations:
            print("VIOLATION:", violation, file=sys.stderr)
        print(f"logs: {self.logs}", file=sys.stderr)
        return 1 if violations else 0

    def cleanup(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        with contextlib.suppress(Exception):
            conn = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
            channel = conn.channel()
            for queue in (f"{self.prefix}.steps", f"{self.prefix}.dead"):
                channel.queue_delete(queue)
            for exchange in (self.prefix, f"{self.prefix}.dlx"):
                channel.exchange_delete(exchange)
            conn.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2, help="workers running at any time")
    parser.add_argument("--rate", type=float, default=8.0, help="webhooks per second")
    parser.add_argument("--duplicates", type=float, default=0.1, help="share delivered twice")
    parser.add_argument(
        "--chaos-interval",
        type=float,
        nargs=2,
        default=(2.0, 5.0),
        metavar=("MIN", "MAX"),
        help="seconds between two chaos events",
    )
    parser.add_argument("--chaos-tail", type=float, default=5.0, help="chaos after the last send")
    parser.add_argument("--broker-restarts", type=int, default=2, help="0: never touch the broker")
    parser.add_argument("--broker-outage", type=float, default=2.0, help="seconds it stays down")
    parser.add_argument("--lease", type=float, default=2.0, help="FLOWFORGE_LEASE_SECONDS")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to settle")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--logs", type=Path, default=None, help="directory for process logs")
    parser.add_argument("--keep", action="store_true", help="keep the database and queues")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one soak; exit 1 on any invariant violation."""
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"seed {seed}", file=sys.stderr)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="flowforge-soak-"))
    logs.mkdir(parents=True, exist_ok=True)
    soak = Soak(
        args,
        admin_url=os.environ.get("FLOWFORGE_TEST_DATABASE_URL") or LOCAL_DATABASE,
        amqp_url=os.environ.get("FLOWFORGE_TEST_AMQP_URL") or LOCAL_AMQP,
        logs=logs,
        rng=random.Random(seed),
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    return soak.run()


if __name__ == "__main__":
    sys.exit(main())
