"""`bin/bench --phase tracing`: what OpenTelemetry tracing costs (issue 31).

chain3 executions driven end to end with tracing off, then with bin/api and bin/worker
restarted with OTEL_TRACES_EXPORTER=otlp exporting every span over OTLP/HTTP to a
collector in the bench process (127.0.0.1, tests/support/otlp.py), alternately, in one
run and one database: a pair's two figures are minutes apart at most, so the shared
machine's drift stays out of their ratio. The figure is CPU per execution; the API's and
the worker's own CPU is what tracing adds to FlowForge (the collector's is the bench's).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from tests.bench import figures
from tests.bench.session import CHAIN3, Session
from tests.support.otlp import Collector

CHAIN3_COUNT = {"quick": 600, "full": 3000}
ROUNDS = {"quick": 2, "full": 3}
# Longer than the batch exporter's schedule (OTEL_BSP_SCHEDULE_DELAY, 5 s by default): the
# spans of a batch of executions have all arrived.
EXPORT_S = 6.0
# Off even when the bench's own environment names an exporter.
OFF = {"OTEL_TRACES_EXPORTER": "none"}


def _restart(s: Session, tracing_env: dict[str, str]) -> None:
    """bin/api and bin/worker again, with these OTEL_* variables (empty: tracing off)."""
    s.stop_worker()
    if s.api is not None:
        s.api.stop()
    s.extra_env = tracing_env
    s.start_api()
    s.start_worker()


def _measure(s: Session, count: int, connections: int) -> dict[str, float]:
    run = figures.executions(s, "chain3", count, connections, measure_commits=False)
    parts = run.cpu_ms_by_part
    return {
        "per_s": run.per_s,
        "executions": run.executions,
        "cpu_ms": run.cpu_ms_per_execution - parts["other"],
        "api_worker_cpu_ms": parts["api"] + parts["worker"],
        "api_cpu_ms": parts["api"],
        "worker_cpu_ms": parts["worker"],
    }


def run(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """Off/on pairs of chain3 runs; each figure the median of its rounds."""
    mode = "quick" if args.quick else "full"
    count, rounds = CHAIN3_COUNT[mode], ROUNDS[mode]
    connections = 2 * args.api_workers
    started = time.monotonic()
    report: dict[str, Any] = {"chain3_per_round": count, "rounds": []}
    with Session.from_args(args) as s:
        collector = Collector()
        s.stack.callback(collector.close)
        traced = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
            "OTEL_SERVICE_NAME": "flowforge-bench",
        }
        s.start_api()
        s.publish("chain3", CHAIN3)
        for n in range(rounds):
            pair: dict[str, Any] = {}
            for name, env in (("off", OFF), ("on", traced)):
                _restart(s, env)
                # Warm-up, not counted: connections, prepared statements, caches.
                figures.executions(s, "chain3", 50, connections, measure_commits=False)
                if name == "on":
                    time.sleep(EXPORT_S)
                before = collector.count()
                pair[name] = _measure(s, count, connections)
                if name == "on":
                    time.sleep(EXPORT_S)
                pair[name]["spans"] = collector.count() - before
                log(
                    f"tracing {name} [{n + 1}/{rounds}]: {pair[name]['per_s']:.0f}/s, "
                    f"{pair[name]['cpu_ms']:.2f} ms CPU per chain3 "
                    f"(api+worker {pair[name]['api_worker_cpu_ms']:.2f})"
                )
            report["rounds"].append(pair)
    for name in ("off", "on"):
        report[name] = {
            key: statistics.median(r[name][key] for r in report["rounds"])
            for key in report["rounds"][0][name]
        }
    report["on_vs_off_cpu"] = statistics.median(
        r["on"]["api_worker_cpu_ms"] / r["off"]["api_worker_cpu_ms"] for r in report["rounds"]
    )
    report["duration_s"] = round(time.monotonic() - started, 1)
    return report


def table(report: dict[str, Any]) -> str:
    """The readable summary."""
    lines = ["", f"[tracing: chain3, median of {len(report['rounds'])} off/on pair(s), one run]"]
    lines.append(
        f"  {'tracing':<10}{'exec/s':>8}{'CPU ms':>9}{'api+wkr':>9}{'api':>8}{'worker':>8}"
        f"{'spans':>8}"
    )
    for name in ("off", "on"):
        r = report[name]
        lines.append(
            f"  {name:<10}{r['per_s']:>8.0f}{r['cpu_ms']:>9.2f}{r['api_worker_cpu_ms']:>9.2f}"
            f"{r['api_cpu_ms']:>8.2f}{r['worker_cpu_ms']:>8.2f}{r['spans']:>8.0f}"
        )
    lines.append(
        f"  on/off, API and worker CPU per execution: {report['on_vs_off_cpu']:.2f}x "
        "(CPU ms: the machine's, without other users; spans: received for the measured batch)"
    )
    return "\n".join(lines)
