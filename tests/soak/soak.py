"""The randomized fault run: a nemesis and a checker in the spirit of Jepsen, against real
bin/api and bin/worker processes.

Three workers (--workers; each reaches PostgreSQL and RabbitMQ through its own fault
proxy, lease 2 s) and two API processes run three plain workflows (unsafe POSTs, keyed
POSTs, GETs, a PUT, delays, a join of parallel branches, `when` conditions; a few delays
wait until a time from the webhook body that PostgreSQL stores but Python cannot load)
and the feature workflows of tests/soak/features.py (concurrency limits with every
on_full, max_queued, start_within_s, deadline_s; schedules with every overlap; wait
steps; retention; an outbound limit with a circuit; a signed source; re-ingest; a map
step of unsafe POSTs; debounce and batch; a child workflow), events correlated by key
(tests/soak/keyed_events.py: sent early, late, twice, for nobody) and search attributes
against a recording target
on 127.0.0.1 that is sometimes slow, failing (503) or hanging past the request timeout. Webhooks go
through both APIs with an Idempotency-Key, some delivered twice (in parallel or later),
each by a patient sender (backoff with jitter and Retry-After for up to 40 s, as real
senders retry), and reads of executions go along.

Meanwhile the nemesis (tests/soak/nemesis.py) SIGKILLs and restarts workers (some
restarted ones stall between claim and send), SIGSTOPs and SIGCONTs them, freezes one
inside a unit of work, resets and blackholes their database and broker links, partitions
a database link right after a lock statement, strands broker links for good, and (by
--servers, tests/soak/servers.py) stops, kills and restarts the run's own PostgreSQL and
RabbitMQ, or fails PostgreSQL over and kills a RabbitMQ node. The operator, on its own
thread, cancels, retries, resolves, completes wait steps, pauses and resumes workflows
and executions, replays (one and in bulk), re-ingests and closes circuits through the
API. Every fault, operator action and API answer goes to history.jsonl.

Then a quiet period: nemesis and operator stop, every proxy passes, every worker runs
and is consuming again, every pause is lifted and the schedules are paused, and the run
waits until everything settled: for as long as the backlog the faults left behind keeps
shrinking (up to --settle-cap in all), and no longer than --settle without progress,
which is what a stuck execution looks like.
The checker (tests/soak/checker.py lists the invariants) reads the target's log, the
history and the database and prints every violation with the attempts, the operator
actions and the long-open database sessions needed to debug it; some checks judge the
whole timeline, faults included (limits, circuits, pauses, replays, 5xx for accepted
events, false unknowns, recovery while a worker is frozen). Last, every worker must
drain on SIGTERM.

With --servers shared nothing stops the shared services: every fault goes through a
per-worker proxy. Each run creates and drops its own database and RabbitMQ names (on
the local services, on FLOWFORGE_TEST_DATABASE_URL / FLOWFORGE_TEST_AMQP_URL, or on its
own servers), also when it fails.

Usage:

    # one run; prints its seed first, exit status 1 on any violation
    .venv/bin/python -m tests.soak.soak --duration 60
    # replay a failure from its seed (use the same options as the failed run)
    .venv/bin/python -m tests.soak.soak --seed 1234 --duration 60
    # the long form (docs/bench/fault-runs.md lists the seeds run and their figures)
    .venv/bin/python -m tests.soak.soak --seed 2321 --seeds 3 --duration 180 --servers own
    .venv/bin/python -m tests.soak.soak --seed 2324 --duration 180 --servers ha
    .venv/bin/python -m tests.soak.soak --seed 2324 --duration 180 --servers ha-partial
    # the short form, as CI runs it (tests/faults/test_randomized.py)
    bin/test tests/faults/test_randomized.py

Replay is best-effort. One seed drives every decision: which workflow and input each
webhook gets, which deliveries are duplicated, the order, kind and length of faults and
operator actions, and (by hashing, not by call order) each answer of the target. What a
fault hits, though, depends on timing — which worker holds which step when a SIGSTOP
lands — and timing on a shared machine never repeats exactly. A seed that failed once
usually fails again in the same category, not necessarily on the same execution; run it
a few times, and read history.jsonl and the process logs under the printed directory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.soak.checker import CIRCUIT_LOG, Checker, Violation, report, settle
from tests.soak.cluster import Cluster
from tests.soak.features import (
    SOURCE,
    SOURCE_SECRET,
    Features,
    feature_definitions,
    source_definition,
)
from tests.soak.history import History, RecordingClient
from tests.soak.keyed_events import EventSender, awaited_definition
from tests.soak.nemesis import Nemesis, Operator
from tests.soak.pressure import BURST, burst_definition
from tests.soak.servers import MODES, Servers
from tests.soak.workload import Workload, definitions, recorded, target_script
from tests.support.services import LOCAL_AMQP, LOCAL_DATABASE
from tests.support.target import Target

HEAL_TIMEOUT_S = 30.0
# A drain waits for running steps; none can take longer than its request timeout.
DRAIN_TIMEOUT_S = 15.0


@dataclass
class Options:
    """Everything a run can vary besides its seed (the command-line flags)."""

    duration: float = 60.0
    workers: int = 3
    rate: float = 4.0
    duplicates: float = 0.15
    poison: float = 0.04
    interval: tuple[float, float] = (0.3, 1.5)
    lease: float = 2.0
    # The product's default: a harness that shortens it hides takeovers that wait for it.
    reconcile: float = 30.0
    concurrency: int = 4
    # Seconds without progress before the quiet wait gives up: above the reconcile
    # interval, so a wake-up lost at the very end is re-dispatched in time.
    settle: float = 45.0
    settle_cap: float = 600.0
    slow: float = 0.15
    fail: float = 0.07
    hang: float = 0.05
    # Where PostgreSQL and RabbitMQ come from (tests/soak/servers.py): shared, own, ha,
    # ha-partial.
    servers: str = "own"
    # New webhooks per second to the feature workflows (features.py); 0: none.
    features: float = 2.0
    # New orders per second of workflow `awaited` (keyed_events.py), each with 0-2 events;
    # 0: none. Only with the feature workflows.
    events: float = 0.6
    # Items of the occasional big map (features.BIG_MAP_SHARE); 0: none.
    map_items: int = 300
    logs: Path | None = None

    def replay_flags(self) -> str:
        """The command-line flags that give these options back."""
        return (
            f"--duration {self.duration:g} --workers {self.workers} --rate {self.rate:g} "
            f"--duplicates {self.duplicates:g} --poison {self.poison:g} "
            f"--interval {self.interval[0]:g} {self.interval[1]:g} --lease {self.lease:g} "
            f"--reconcile {self.reconcile:g} --concurrency {self.concurrency} "
            f"--settle {self.settle:g} --settle-cap {self.settle_cap:g} "
            f"--servers {self.servers} --features {self.features:g} --events {self.events:g} "
            f"--map-items {self.map_items}"
        )


@dataclass
class Outcome:
    """One seed's verdict."""

    seed: int
    violations: list[Violation]
    figures: dict[str, Any] = field(default_factory=dict)
    logs: Path | None = None

    def summary(self) -> str:
        """The report, followed by the command that replays it."""
        counts = dict(Counter(v.category for v in self.violations))
        return (
            f"{report(self.violations)}\n"
            f"seed {self.seed}: {len(self.violations)} violation(s) {counts}; logs {self.logs}"
        )


def _thread(name: str, body: Callable[[], None], errors: list[BaseException]) -> threading.Thread:
    """A thread whose exception fails the run instead of vanishing."""

    def guarded() -> None:
        try:
            body()
        except BaseException as exc:
            errors.append(exc)
            raise

    thread = threading.Thread(target=guarded, name=name, daemon=True)
    thread.start()
    return thread


def run_one(seed: int, options: Options, admin_url: str, amqp_url: str) -> Outcome:
    """One run: set up, load and fault for `duration`, heal, settle, check, tear down."""
    print(f"seed {seed}", flush=True)
    logs = options.logs or Path(tempfile.mkdtemp(prefix="flowforge-soak-"))
    logs = logs / f"seed-{seed}"
    logs.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    workload_rng, nemesis_rng, operator_rng = (random.Random(rng.random()) for _ in range(3))
    history = History(logs / "history.jsonl")
    target = Target()
    # Killed workers reset their connections to the target: expected here, not news.
    target.server.handle_error = lambda *_args: None  # type: ignore[method-assign]
    quiet = threading.Event()
    replies: dict[int, Any] = {}
    target.script = recorded(
        target_script(seed, options.slow, options.fail, options.hang, quiet), replies
    )
    servers = Servers(options.servers, admin_url, amqp_url)
    cluster = Cluster(
        servers.admin_url,
        servers.amqp_url,
        logs,
        workers=options.workers,
        lease_s=options.lease,
        reconcile_s=options.reconcile,
        concurrency=options.concurrency,
        proxied=servers.proxied,
        extra_env=servers.extra_env,
    )
    servers.steps_queue = f"{cluster.prefix}.steps"
    try:
        cluster.start()
        with psycopg.connect(cluster.database_url, autocommit=True) as conn:
            conn.execute(CIRCUIT_LOG)
        client = RecordingClient(history, cluster.api_key)
        servers.attach_disk(cluster.database_url)
        published = definitions(target)
        if options.features:
            published.update(feature_definitions(target))
            published[BURST] = burst_definition(target.url)
            if options.events:
                published["awaited"] = awaited_definition(target)
        for key, definition in published.items():
            url = f"{cluster.api_bases[0]}/api/v1/workflows/{key}/versions"
            r = client.request("setup", "POST", url, json=definition)
            if r is None or r.status_code != 201:
                raise RuntimeError(f"publishing {key}: {r.text if r is not None else 'no answer'}")
        if options.features:
            base = f"{cluster.api_bases[0]}/api/v1/sources/{SOURCE}"
            for url, body in ((base, source_definition()), (f"{base}/webhook-secrets", None)):
                body = body if body is not None else {"value": SOURCE_SECRET}
                r = client.request("setup", "POST", url, json=body)
                if r is None or r.status_code not in (200, 201):
                    raise RuntimeError(f"source: {r.text if r is not None else 'no answer'}")
        features = Features(
            client,
            cluster.api_bases,
            random.Random(workload_rng.random()),
            target,
            rate=options.features,
            map_items=options.map_items,
        )
        # Its own generator: the other senders', the nemesis's and the operator's draws of a
        # seed stay what they were before it existed.
        events = EventSender(
            client,
            cluster.api_bases,
            random.Random(seed * 1_000_003 + 44),
            features,
            target,
            rate=options.events,
        )
        workload = Workload(
            client,
            cluster.api_bases,
            workload_rng,
            rate=options.rate,
            duplicates=options.duplicates,
            poison=options.poison,
        )
        nemesis = Nemesis(
            cluster,
            history,
            nemesis_rng,
            interval=options.interval,
            lease_s=options.lease,
            servers=servers,
        )
        operator = Operator(cluster, client, history, operator_rng, interval=options.interval)
        nemesis.cancel = operator.cancel_now
        if options.features:
            nemesis.burst = features.burst
        stop = threading.Event()
        errors: list[BaseException] = []
        threads = [
            _thread("soak-workload", lambda: workload.run(stop), errors),
            _thread("soak-nemesis", lambda: nemesis.run(stop), errors),
            _thread("soak-operator", lambda: operator.run(stop), errors),
        ]
        if options.features:
            threads.append(_thread("soak-features", lambda: features.run(stop), errors))
            if options.events:
                threads.append(_thread("soak-events", lambda: events.run(stop), errors))
        stop.wait(options.duration)
        stop.set()
        for thread in threads:
            thread.join()
        if errors:
            raise RuntimeError("the workload or the nemesis crashed") from errors[0]
        history.fault("quiet", "all")
        quiet.set()
        unhealthy = cluster.heal(HEAL_TIMEOUT_S)
        operator.heal()
        settling = settle(cluster.database_url, options.settle, options.settle_cap)
        history.fault(
            "check",
            "all",
            f"settled in {settling.seconds}s, backlog {settling.backlog}, left {settling.left}",
        )
        checker = Checker(
            cluster,
            client,
            history,
            workload,
            target,
            features,
            replies,
            servers,
            published,
            events if options.features and options.events else None,
        )
        violations = checker.run(unhealthy)
        for worker, code in cluster.drain(DRAIN_TIMEOUT_S).items():
            if code != 0:
                how = "still draining" if code is None else f"exited {code}"
                violations.append(
                    Violation("drain_stuck", f"{worker}: {how} {DRAIN_TIMEOUT_S:g}s after SIGTERM")
                )
        figures = {
            "seed": seed,
            **checker.figures(),
            "reads": workload.reads,
            "backlog_at_quiet": settling.backlog,
            "settled_s": settling.seconds,
            "violations": len(violations),
        }
        print(json.dumps(figures), flush=True)
        outcome = Outcome(seed, violations, figures, logs)
        for line in checker.diagnostics():
            print(line, flush=True)
        print(outcome.summary(), flush=True)
        if violations:
            print(
                f"replay (best effort): .venv/bin/python -m tests.soak.soak --seed {seed} "
                f"{options.replay_flags()}",
                flush=True,
            )
        return outcome
    finally:
        try:
            cluster.close()
        finally:
            try:
                servers.close()
            finally:
                target.close()
                history.close()


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Options]:
    """Command-line options."""
    d = Options()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--seeds", type=int, default=1, help="run SEED, SEED+1, ... (N runs)")
    parser.add_argument("--duration", type=float, default=d.duration, help="seconds of nemesis")
    parser.add_argument("--workers", type=int, default=d.workers)
    parser.add_argument("--rate", type=float, default=d.rate, help="new webhooks per second")
    parser.add_argument("--duplicates", type=float, default=d.duplicates)
    parser.add_argument("--poison", type=float, default=d.poison, help="share of bad delays")
    parser.add_argument(
        "--interval",
        type=float,
        nargs=2,
        default=d.interval,
        metavar=("MIN", "MAX"),
        help="seconds between two nemesis operations",
    )
    parser.add_argument("--lease", type=float, default=d.lease, help="FLOWFORGE_LEASE_SECONDS")
    parser.add_argument("--reconcile", type=float, default=d.reconcile)
    parser.add_argument("--concurrency", type=int, default=d.concurrency)
    parser.add_argument(
        "--settle", type=float, default=d.settle, help="quiet wait: seconds without progress"
    )
    parser.add_argument(
        "--settle-cap", type=float, default=d.settle_cap, help="quiet wait: seconds in all"
    )
    parser.add_argument("--servers", choices=MODES, default=d.servers)
    parser.add_argument(
        "--features", type=float, default=d.features, help="feature webhooks per second"
    )
    parser.add_argument(
        "--events", type=float, default=d.events, help="keyed-event orders per second"
    )
    parser.add_argument(
        "--map-items", type=int, default=d.map_items, help="items of the occasional big map"
    )
    parser.add_argument("--logs", type=Path, default=None, help="directory for logs")
    args = parser.parse_args(argv)
    options = Options(
        duration=args.duration,
        workers=args.workers,
        rate=args.rate,
        duplicates=args.duplicates,
        poison=args.poison,
        interval=tuple(args.interval),
        lease=args.lease,
        reconcile=args.reconcile,
        concurrency=args.concurrency,
        settle=args.settle,
        settle_cap=args.settle_cap,
        servers=args.servers,
        features=args.features,
        events=args.events,
        map_items=args.map_items,
        logs=args.logs,
    )
    return args, options


def main(argv: list[str] | None = None) -> int:
    """Run one or more seeds; exit 1 when any of them found a violation."""
    args, options = parse_args(argv)
    first = args.seed if args.seed is not None else random.randrange(2**31)
    admin_url = os.environ.get("FLOWFORGE_TEST_DATABASE_URL") or LOCAL_DATABASE
    amqp_url = os.environ.get("FLOWFORGE_TEST_AMQP_URL") or LOCAL_AMQP
    # SIGTERM unwinds through run_one's cleanup like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    outcomes = [
        run_one(seed, options, admin_url, amqp_url) for seed in range(first, first + args.seeds)
    ]
    if len(outcomes) > 1:
        for outcome in outcomes:
            counts = dict(Counter(v.category for v in outcome.violations))
            print(f"seed {outcome.seed}: {len(outcome.violations)} violation(s) {counts}")
    return 1 if any(o.violations for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
