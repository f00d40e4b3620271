"""bin/bench: measure this machine's limits, then FlowForge, in one run; print the ratios.

    bin/bench [--phase saturation|steady|all|tracing|outbound|counts|live|attributes|failure_groups
              |events] [--quick] [--json FILE] [--failures N] [--events N]
              [--api-workers N] [--worker-concurrency N] [--profile DIR] [--keep-logs]

The saturation phase sends as fast as the server takes it; the steady phase
(tests/bench/steady.py) sends a steady stream, where nothing batches.

On a shared 2-core machine an absolute figure means little; a ratio measured in the same
run means a lot. Everything runs on 127.0.0.1 in a private database and RabbitMQ vhost
that the bench creates and removes, also on Ctrl-C and errors.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from flowforge.store.config import Settings
from flowforge.worker.broker import BROKER_ERRORS
from tests.bench import (
    attributes,
    counts,
    events,
    failure_groups,
    figures,
    flow_control,
    limits,
    live,
    load,
    outbound,
    priorities,
    resume_latency,
    steady,
    tracing,
)
from tests.bench.infra import ADMIN_DATABASE, BenchError, machine, machine_cpu_ms, rabbitmqctl
from tests.bench.session import CHAIN3, SLEEPER, Interrupted, Session, fan_definition

T = TypeVar("T")


@dataclass(frozen=True)
class Plan:
    """How much of everything one run does."""

    repetitions: int
    pgbench_s: int
    wrk_s: int
    amqp_confirm_each: int
    amqp_batched: int
    relay_rows: int
    chain3: int
    fan: int
    latency_s: int
    sleepers: int
    resumes: int = 300


RESUME_RATE = 50.0  # resumes per second, open loop


QUICK = Plan(1, 4, 4, 2000, 50_000, 50_000, 500, 250, 6, 1_000_000, 300)
FULL = Plan(3, 15, 10, 5000, 50_000, 50_000, 2000, 1000, 20, 1_000_000, 1000)

# (figure, comparison, target) from issue 6.
TARGETS: list[tuple[str, str, float]] = [
    ("webhook_vs_bare_flask", ">=", 0.85),
    ("relay_vs_amqp_batched", ">=", 0.8),
    ("chain3_per_s", ">=", 185),
    ("cpu_ms_per_chain3", "<=", 9),
    ("commits_per_chain3", "<=", 4),
    ("latency_ms.p50", "<=", 10),
    ("latency_ms.p99", "<=", 50),
    ("delay_backlog_ratio", ">=", 0.9),
    ("worker_rss_mb", "<=", 80),
    # From issue 12.
    ("chain3_limited_ratio", ">=", 0.9),
    ("quiet_key_latency_ms.p99", "<=", 1000),
]


def log(message: str) -> None:
    """Progress on stderr, so stdout carries only the table."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


def repeat(name: str, times: int, measure: Callable[[], T], show: Callable[[T], str]) -> list[T]:
    """Run a measurement `times` times, logging each result."""
    results = []
    for i in range(times):
        started = time.monotonic()
        result = measure()
        results.append(result)
        took = time.monotonic() - started
        log(f"{name} [{i + 1}/{times}] {show(result)}  ({took:.1f}s)")
    return results


def _timed(name: str, measure: Callable[[], T], show: Callable[[T], str]) -> T:
    """One measurement, logged with how long it took."""
    started = time.monotonic()
    result = measure()
    log(f"{name} {show(result)}  ({time.monotonic() - started:.1f}s)")
    return result


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def run(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    """The whole measurement; returns the report."""
    reps = plan.repetitions
    report: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "repetitions": reps,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "plan": asdict(plan),
        "load_generators": load.describe(),
    }
    started = time.monotonic()
    report["machine"]["background_cpu_pct"] = background_cpu_pct()
    connections = 2 * args.api_workers
    with Session.from_args(args) as s:
        report["machine"]["postgresql"] = s.scalar("SHOW server_version")
        report["machine"]["postgresql_server"] = (
            "own throwaway cluster (--own-postgres) with the local server's settings: "
            + ", ".join(f"{k}={v}" for k, v in s.own_postgres_settings.items())
            if args.own_postgres
            else "the local server"
        )
        report["machine"]["rabbitmq"] = rabbitmqctl("version").strip()
        report["settings"] = {
            "gunicorn": "bin/api's own command line (flowforge.api.serve.gunicorn_argv): "
            f"sync workers, --workers {args.api_workers}",
            "api_workers": args.api_workers,
            "api_db_pool_size": Settings().db_pool_size,
            "worker_concurrency": args.worker_concurrency,
            "wrk_connections": connections,
            "relay_batch": limits.RELAY_BATCH,
        }
        s.start_api()
        log(f"bin/api up with {args.api_workers} gunicorn workers; database {s.db.name}")
        s.publish("chain3", CHAIN3)
        s.publish("sleeper", SLEEPER)
        stub = figures.Stub()
        s.stack.callback(stub.close)
        s.publish("fan", fan_definition(stub.url))
        flow_control.publish(s)
        priorities.publish(s, stub.url)

        # ---- limits -------------------------------------------------------------------
        lim: dict[str, Any] = {}
        lim["pg_tx_per_s"] = median(
            repeat(
                "pg_tx_per_s",
                reps,
                lambda: limits.pg_tx_per_s(s, args.api_workers, plan.pgbench_s),
                lambda v: f"{v:.0f}/s",
            )
        )
        lim["amqp_confirm_each_per_s"] = median(
            repeat(
                "amqp_confirm_each_per_s",
                reps,
                lambda: limits.amqp_confirm_each_per_s(s, plan.amqp_confirm_each),
                lambda v: f"{v:.0f}/s",
            )
        )

        # ---- limit and FlowForge side by side: intake and relay, no worker running ----
        # Each FlowForge figure is measured right after its limit, and its ratio is taken
        # within the pair: on a shared machine the background load drifts between
        # minutes, rarely between two adjacent measurements.
        ff: dict[str, Any] = {}
        bare = limits.BareFlask(s)
        pairs: list[dict[str, Any]] = []
        for i in range(reps):
            pair: dict[str, Any] = {}
            pair["bare"] = _timed(
                f"bare_flask_per_s [{i + 1}/{reps}]",
                lambda: bare.per_s(connections, plan.wrk_s),
                lambda v: f"{v['per_s']:.0f}/s ({v['cpu_ms_own']:.2f} ms CPU)",
            )
            pair["webhook"] = _timed(
                f"webhook_per_s [{i + 1}/{reps}]",
                lambda: figures.webhook_per_s(s, connections, plan.wrk_s),
                lambda v: (
                    f"{v['per_s']:.0f}/s ({v['cpu_ms_own']:.2f} ms CPU, "
                    f"wrk p99 {v['wrk_p99_ms']:.1f} ms)"
                ),
            )
            pair["amqp_batched_per_s"] = _timed(
                f"amqp_batched_per_s [{i + 1}/{reps}]",
                lambda: limits.amqp_batched_per_s(s, plan.amqp_batched),
                lambda v: f"{v:.0f}/s",
            )
            pair["relay"] = _timed(
                f"relay_per_s [{i + 1}/{reps}]",
                lambda: figures.relay_per_s(s, plan.relay_rows),
                lambda v: f"{v['per_s']:.0f}/s ({v['duplicates']} duplicates)",
            )
            pairs.append(pair)
        bare.stop()
        hooks = [p["webhook"] for p in pairs]
        lim["bare_flask_per_s"] = median([p["bare"]["per_s"] for p in pairs])
        lim["bare_flask_cpu_ms"] = median([p["bare"]["cpu_ms_own"] for p in pairs])
        lim["amqp_batched_per_s"] = median([p["amqp_batched_per_s"] for p in pairs])
        report["limits"] = lim
        ff["webhook_per_s"] = median([h["per_s"] for h in hooks])
        ff["webhook_cpu_ms"] = median([h["cpu_ms_own"] for h in hooks])
        ff["relay_per_s"] = median([p["relay"]["per_s"] for p in pairs])
        ff["relay_duplicates"] = sum(p["relay"]["duplicates"] for p in pairs)
        paired = {
            "webhook_vs_bare_flask": median(
                [p["webhook"]["per_s"] / p["bare"]["per_s"] for p in pairs]
            ),
            # The same comparison in CPU per request (bare / FlowForge): it hardly moves
            # when other users of a shared machine come and go.
            "webhook_vs_bare_flask_cpu": median(
                [p["bare"]["cpu_ms_own"] / p["webhook"]["cpu_ms_own"] for p in pairs]
            ),
            "relay_vs_amqp_batched": median(
                [p["relay"]["per_s"] / p["amqp_batched_per_s"] for p in pairs]
            ),
        }

        # ---- flowforge: end to end, worker running -------------------------------------
        s.start_worker()
        # Warm-up, not counted: connections, prepared statements, definition caches.
        figures.executions(s, "chain3", 50, connections, measure_commits=False)
        figures.executions(s, "fan", 20, connections, measure_commits=False)
        chains = repeat(
            "chain3",
            reps,
            lambda: figures.executions(s, "chain3", plan.chain3, connections),
            _show_run,
        )
        fans = repeat(
            "fan",
            reps,
            # Commit counts of the fan are a curiosity; --quick saves their 11 s waits.
            lambda: figures.executions(
                s, "fan", plan.fan, connections, measure_commits=not args.quick
            ),
            _show_run,
        )
        ff["chain3_per_s"] = median([c.per_s for c in chains])
        ff["fan_per_s"] = median([f.per_s for f in fans])
        ff["commits_per_chain3"] = median([c.commits_per_execution for c in chains])
        ff["cpu_ms_per_chain3"] = median([c.cpu_ms_per_execution for c in chains])
        ff["cpu_ms_per_chain3_by_part"] = {
            part: median([c.cpu_ms_by_part[part] for c in chains])
            for part in chains[0].cpu_ms_by_part
        }
        ff["cpu_ms_per_chain3_own"] = median(
            [c.cpu_ms_per_execution - c.cpu_ms_by_part["other"] for c in chains]
        )
        ff["write_tx_per_chain3"] = median([c.write_tx_per_execution for c in chains])
        ff["commits_per_fan"] = median([f.commits_per_execution for f in fans])
        ff["cpu_ms_per_fan"] = median([f.cpu_ms_per_execution for f in fans])
        rate = ff["chain3_per_s"] / 2
        lats = repeat(
            "latency",
            reps,
            lambda: figures.latency(s, rate, plan.latency_s),
            lambda v: f"p50 {v['p50']:.1f} ms p99 {v['p99']:.1f} ms at {v['rate_achieved']:.0f}/s",
        )
        ff["latency_ms"] = {
            "p50": median([v["p50"] for v in lats]),
            "p99": median([v["p99"] for v in lats]),
            "rate_per_s": rate,
        }
        ff["worker_rss_mb"] = median([c.worker_rss_peak_mb for c in chains])
        resumed = repeat(
            "resume_latency",
            reps,
            lambda: resume_latency.measure(s, stub.url, plan.resumes, RESUME_RATE),
            lambda v: f"p50 {v['p50']:.1f} ms p99 {v['p99']:.1f} ms",
        )
        ff["resume_latency_ms"] = {
            "p50": median([v["p50"] for v in resumed]),
            "p99": median([v["p99"] for v in resumed]),
            "rate_per_s": RESUME_RATE,
        }

        # ---- flow control: the price of a limit, and fairness across keys ---------------
        limited = repeat(
            "chain3 (limit 8)",
            reps,
            lambda: flow_control.limited(s, plan.chain3, connections),
            _show_run,
        )
        ff["chain3_limited_per_s"] = median([c.per_s for c in limited])
        ff["chain3_limited_ratio"] = ff["chain3_limited_per_s"] / ff["chain3_per_s"]
        ff["quiet_key_latency_ms"] = _timed(
            f"quiet keys ({flow_control.BACKLOG:,} queued on another)",
            lambda: flow_control.quiet_key_latency(s),
            lambda v: f"p50 {v['p50']:.0f} ms p99 {v['p99']:.0f} ms",
        )

        # ---- priorities: high-priority work under a backlog of low-priority work -------
        backlog = 1_000 if args.quick else 3_000
        ff["priority_wait_ms"] = _timed(
            f"priorities ({backlog:,} low queued, {priorities.HIGH_COUNT} high arriving)",
            lambda: priorities.run(s, backlog),
            priorities.show,
        )

        # ---- flowforge with a million sleeping delays ---------------------------------
        # Baselines right before the load, then the same with the delays in place: the
        # ratios compare measurements a minute apart, not ten.
        chains_base = repeat(
            "chain3 (baseline)",
            reps,
            lambda: figures.executions(
                s, "chain3", plan.chain3, connections, measure_commits=False
            ),
            _show_run,
        )
        s.stop_worker()
        hooks_base = repeat(
            "webhook_per_s (baseline)",
            reps,
            lambda: figures.webhook_per_s(s, connections, plan.wrk_s),
            lambda v: f"{v['per_s']:.0f}/s",
        )
        pg_base = _timed(
            "pg_tx_per_s (baseline)",
            lambda: limits.pg_tx_per_s(s, args.api_workers, plan.pgbench_s),
            lambda v: f"{v:.0f}/s",
        )
        s.reset()
        log(f"loading {plan.sleepers:,} sleeping delays ...")
        load_s = s.insert_sleepers(plan.sleepers)
        log(f"loaded in {load_s:.1f}s")
        # How much of the drop is PostgreSQL's own: the same limit, same table sizes.
        pg_d = _timed(
            "pg_tx_per_s (delays)",
            lambda: limits.pg_tx_per_s(s, args.api_workers, plan.pgbench_s),
            lambda v: f"{v:.0f}/s",
        )
        hooks_d = repeat(
            "webhook_per_s (delays)",
            reps,
            lambda: figures.webhook_per_s(s, connections, plan.wrk_s),
            lambda v: f"{v['per_s']:.0f}/s",
        )
        s.start_worker()
        chains_d = repeat(
            "chain3 (delays)",
            reps,
            lambda: figures.executions(
                s, "chain3", plan.chain3, connections, measure_commits=False
            ),
            _show_run,
        )
        webhook_base = median([h["per_s"] for h in hooks_base])
        chain3_base = median([c.per_s for c in chains_base])
        webhook_d = median([h["per_s"] for h in hooks_d])
        chain3_d = median([c.per_s for c in chains_d])
        ff["delay_backlog"] = {
            "sleeping_delays": plan.sleepers,
            "load_s": load_s,
            "webhook_per_s_before": webhook_base,
            "webhook_per_s": webhook_d,
            "chain3_per_s_before": chain3_base,
            "chain3_per_s": chain3_d,
            "webhook_ratio": webhook_d / webhook_base,
            "chain3_ratio": chain3_d / chain3_base,
            "pg_tx_per_s_before": pg_base,
            "pg_tx_per_s": pg_d,
            "pg_tx_ratio": pg_d / pg_base,
        }
        ff["delay_backlog_ratio"] = min(
            ff["delay_backlog"]["webhook_ratio"], ff["delay_backlog"]["chain3_ratio"]
        )
        report["flowforge"] = ff
        report["raw"] = {
            "pairs": pairs,
            "chain3": [asdict(c) for c in chains],
            "fan": [asdict(f) for f in fans],
            "latency": lats,
            "webhook_before_delays": hooks_base,
            "webhook_delays": hooks_d,
            "chain3_before_delays": [asdict(c) for c in chains_base],
            "chain3_delays": [asdict(c) for c in chains_d],
        }
        failed = sum(c.failed for c in [*chains, *fans, *chains_base, *chains_d])
        if failed:
            log(f"WARNING: {failed} executions did not succeed; see the worker log")
        report["failed_executions"] = failed
    report["ratios"] = {
        **paired,
        "chain3_vs_pg_tx": ff["chain3_per_s"] / lim["pg_tx_per_s"],
    }
    report["targets"] = [_judge(report, *t) for t in TARGETS]
    report["duration_s"] = round(time.monotonic() - started, 1)
    return report


def background_cpu_pct(seconds: float = 3.0) -> float:
    """How busy the machine is before the bench starts anything: on a shared machine
    every figure below is only as good as this number is small."""
    before, _ = machine_cpu_ms()
    time.sleep(seconds)
    after, _ = machine_cpu_ms()
    return 100.0 * (after - before) / (seconds * 1000.0 * (os.cpu_count() or 1))


def _clean(value: Any) -> Any:
    """JSON has no NaN: figures that were not measured become null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _show_run(r: figures.ExecutionRun) -> str:
    commits = (
        ""
        if r.commits_per_execution != r.commits_per_execution
        else (f"{r.commits_per_execution:.2f} commits, ")
    )
    return (
        f"{r.per_s:.0f}/s over {r.executions} ({r.cpu_ms_per_execution:.1f} ms CPU, "
        f"{commits}{r.write_tx_per_execution:.2f} write tx, worker {r.worker_rss_peak_mb:.0f} MB"
        + (f", {r.failed} FAILED" if r.failed else "")
        + ")"
    )


def _lookup(report: dict[str, Any], name: str) -> float:
    for section in ("ratios", "flowforge", "limits"):
        value: Any = report.get(section, {})
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            return float(value)
    raise KeyError(name)


def _judge(report: dict[str, Any], name: str, op: str, target: float) -> dict[str, Any]:
    value = _lookup(report, name)
    met = value >= target if op == ">=" else value <= target
    return {"figure": name, "value": value, "target": f"{op} {target:g}", "met": met}


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"  # ratios: 0.849 must not print as a met 0.85


def table(report: dict[str, Any]) -> str:
    """The readable summary."""
    m, st = report["machine"], report["settings"]
    lim, ff, ratios = report["limits"], report["flowforge"], report["ratios"]
    delays = ff["delay_backlog"]
    by_part = ", ".join(f"{k} {v:.1f}" for k, v in ff["cpu_ms_per_chain3_by_part"].items())
    sections: list[tuple[str, list[tuple[str, str, str]]]] = [
        (
            "limits",
            [
                ("pg_tx_per_s", _fmt(lim["pg_tx_per_s"]), f"pgbench, {st['api_workers']} clients"),
                (
                    "bare_flask_per_s",
                    _fmt(lim["bare_flask_per_s"]),
                    f"same tx, bin/api's gunicorn; {lim['bare_flask_cpu_ms']:.2f} ms CPU each",
                ),
                ("amqp_confirm_each_per_s", _fmt(lim["amqp_confirm_each_per_s"]), "pika"),
                (
                    "amqp_batched_per_s",
                    _fmt(lim["amqp_batched_per_s"]),
                    f"pika, one AMQP tx per {st['relay_batch']}",
                ),
            ],
        ),
        (
            "flowforge",
            [
                (
                    "webhook_per_s",
                    _fmt(ff["webhook_per_s"]),
                    f"202s/s, worker stopped; {ff['webhook_cpu_ms']:.2f} ms CPU each",
                ),
                (
                    "relay_per_s",
                    _fmt(ff["relay_per_s"]),
                    f"{report['plan']['relay_rows']:,}-row backlog",
                ),
                ("chain3_per_s", _fmt(ff["chain3_per_s"]), f"N={report['plan']['chain3']}"),
                ("fan_per_s", _fmt(ff["fan_per_s"]), f"N={report['plan']['fan']}"),
                (
                    "commits_per_chain3",
                    _fmt(ff["commits_per_chain3"]),
                    f"pg_stat_database; {ff['write_tx_per_chain3']:.2f} of them write (xids)",
                ),
                ("cpu_ms_per_chain3", _fmt(ff["cpu_ms_per_chain3"]), "whole machine"),
                ("  of which", "", by_part),
                (
                    "  without 'other'",
                    _fmt(ff["cpu_ms_per_chain3_own"]),
                    "other users of a shared machine excluded",
                ),
                (
                    "latency_ms.p50",
                    _fmt(ff["latency_ms"]["p50"]),
                    f"open loop at {ff['latency_ms']['rate_per_s']:.0f}/s",
                ),
                ("latency_ms.p99", _fmt(ff["latency_ms"]["p99"]), ""),
                (
                    "chain3_limited_ratio",
                    _fmt(ff["chain3_limited_ratio"]),
                    f"chain3 with concurrency limit 8: {ff['chain3_limited_per_s']:.0f}/s",
                ),
                (
                    "quiet_key_latency_ms.p99",
                    _fmt(ff["quiet_key_latency_ms"]["p99"]),
                    f"first execution of a quiet key, {ff['quiet_key_latency_ms']['backlog']:,}"
                    f" queued on another (p50 {ff['quiet_key_latency_ms']['p50']:.0f} ms)",
                ),
                (
                    "priority_wait_ms.high_p99",
                    _fmt(ff["priority_wait_ms"]["on"]["high_p99_ms"]),
                    priorities.describe(ff["priority_wait_ms"]),
                ),
                (
                    "resume_latency_ms.p50",
                    _fmt(ff["resume_latency_ms"]["p50"]),
                    f"resume -> next step started, open loop at {RESUME_RATE:.0f}/s",
                ),
                ("resume_latency_ms.p99", _fmt(ff["resume_latency_ms"]["p99"]), ""),
                (
                    "delay_backlog_ratio",
                    _fmt(ff["delay_backlog_ratio"]),
                    f"webhook {delays['webhook_ratio']:.2f}, chain3 {delays['chain3_ratio']:.2f}"
                    f" with {delays['sleeping_delays']:,} delays (pgbench alone: "
                    f"{delays['pg_tx_ratio']:.2f})",
                ),
                (
                    "worker_rss_mb",
                    _fmt(ff["worker_rss_mb"]),
                    f"peak, {st['worker_concurrency']} executor threads",
                ),
            ],
        ),
        ("ratios", [(name, _fmt(value), "") for name, value in ratios.items()]),
        (
            "targets",
            [
                (
                    t["figure"],
                    _fmt(t["value"]),
                    f"{t['target']}: {'met' if t['met'] else 'NOT met'}",
                )
                for t in report["targets"]
            ],
        ),
    ]
    width = max(len(name) for _, rows in sections for name, _, _ in rows) + 2
    lines = [
        f"FlowForge bench ({report['mode']}, median of {report['repetitions']}) on "
        f"{m['nproc']} x {m['cpu_model']}, {m['memory_gb']} GB RAM, "
        f"PostgreSQL {m.get('postgresql')}, RabbitMQ {m.get('rabbitmq')}",
        f"load: {report['load_generators']['throughput']}",
        f"latency: {report['load_generators']['latency']}",
    ]
    other = ff["cpu_ms_per_chain3_by_part"].get("other", 0.0) / max(ff["cpu_ms_per_chain3"], 1e-9)
    if m["background_cpu_pct"] > 5 or other > 0.1:
        lines.append(
            f"WARNING: the machine was busy with other work ({m['background_cpu_pct']:.0f}% "
            f"before the run, {100 * other:.0f}% of the CPU during chain3): figures are low"
        )
    for title, rows in sections:
        lines.append(f"\n[{title}]")
        for name, value, note in rows:
            lines.append(f"  {name:<{width}}{value:>10}  {note}".rstrip())
    lines.append(f"\ntook {report['duration_s']:.0f}s")
    return "\n".join(lines)


# The phases `all` does not run: each is one module's run and table.
STANDALONE: dict[str, Any] = {
    "tracing": tracing,
    "counts": counts,
    "live": live,
    "attributes": attributes,
    "failure_groups": failure_groups,
    "events": events,
    "outbound": outbound,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    default_workers = int(os.environ.get("FLOWFORGE_API_WORKERS", 2 * (os.cpu_count() or 1) + 1))
    p = argparse.ArgumentParser(prog="bin/bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "--phase",
        choices=("saturation", "steady", "all", *STANDALONE),
        default="all",
        help="saturation: as fast as it goes; steady: a steady stream (< 5 min); default all; "
        "tracing: chain3 CPU with OpenTelemetry traces exported vs off (not part of all); "
        "outbound: slow and https targets, a shared rate limit (issue 27, not part of all; "
        "--quick about 3 min, full 20 min or more); counts: statements, round trips, commits, "
        "NOTIFYs and bytes per webhook, chain3 and step at 1 and 8 senders (not part of all; "
        "about 2 min); live: bin/api's CPU for --pages open console execution pages (not part "
        "of all; about 3 min); attributes: filters by search attributes on 1,000,000 "
        "executions filled by SQL (--quick: 100,000; not part of all); failure_groups: the failure "
        "path with and without failure groups (not part of all; --failures per mode); events: N "
        "waiting executions receiving N events vs N plain webhooks (not part of all; --events N)",
    )
    p.add_argument(
        "--failures",
        type=int,
        default=failure_groups.DEFAULT_FAILURES,
        help="failure_groups: failures per mode",
    )
    p.add_argument("--events", type=int, default=500, help="N of the events phase (default 500)")
    p.add_argument("--quick", action="store_true", help="one repetition, smaller counts (< 3 min)")
    p.add_argument("--pages", type=int, default=500, help="live: open execution pages (500)")
    p.add_argument("--watched", type=int, default=40, help="live: executions they watch (40)")
    p.add_argument("--seconds", type=float, default=60, help="live: each window's length (60)")
    p.add_argument("--rate", type=float, default=5, help="live: steady load, webhooks/s (5)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write every figure to FILE")
    p.add_argument(
        "--api-workers",
        type=int,
        default=default_workers,
        help=f"gunicorn workers for bin/api and the bare Flask limit (default {default_workers}, "
        "bin/api's own default)",
    )
    p.add_argument("--worker-concurrency", type=int, default=8, help="executor threads (default 8)")
    p.add_argument(
        "--admin-url",
        default=os.environ.get("FLOWFORGE_BENCH_DATABASE_URL", ADMIN_DATABASE),
        help="PostgreSQL URL allowed to create databases (superuser for the bulk load)",
    )
    p.add_argument(
        "--own-postgres",
        action="store_true",
        help="run a throwaway PostgreSQL cluster (same binaries and settings as the local "
        "server) instead of using the local server: for machines where tests restart it",
    )
    p.add_argument("--profile", type=Path, metavar="DIR", help="py-spy raw profiles into DIR")
    p.add_argument("--keep-logs", action="store_true", help="keep API and worker logs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of bin/bench."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    plan = QUICK if args.quick else FULL
    report: dict[str, Any] = {}
    try:
        if args.phase in ("saturation", "all"):
            report = run(plan, args)
            print(table(report), flush=True)
        if args.phase in ("steady", "all"):
            report["steady"] = steady.run(args, log)
            print(steady.table(report["steady"]), flush=True)
        if args.phase in STANDALONE:
            phase = STANDALONE[args.phase]
            report[args.phase] = phase.run(args, log)
            print(phase.table(report[args.phase]), flush=True)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Interrupted):
        print("bench: interrupted; everything it started was stopped and removed", file=sys.stderr)
        return 130
    except subprocess.TimeoutExpired as exc:
        print(f"bench: a tool timed out: {exc}", file=sys.stderr)
        return 1
    except (psycopg.OperationalError, *BROKER_ERRORS) as exc:
        # On a shared machine another session may restart PostgreSQL or RabbitMQ.
        print(f"bench: a service went away during the run: {exc!r}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(_clean(report), indent=2, default=str) + "\n")
        log(f"figures written to {args.json}")
    return 0
