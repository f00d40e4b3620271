"""The parts of bin/bench whose silent breakage would make its figures lie."""

from __future__ import annotations

import math

from flowforge.api.serve import gunicorn_argv
from tests.bench import bare_serve, steady
from tests.bench.bench import _clean, _judge
from tests.bench.load import _parse


def test_bare_flask_runs_under_exactly_bin_apis_gunicorn_command_line() -> None:
    # webhook_vs_bare_flask compares like with like only while this holds.
    args = ["--bind", "127.0.0.1:9", "--workers", "5"]
    env = {"PORT": "1", "FLOWFORGE_API_WORKERS": "7"}
    bare = bare_serve.argv(args, env)
    api = gunicorn_argv(args, env)
    assert bare[:-1] == api[:-1]
    assert api[-1] == bare_serve.FLOWFORGE_APP
    assert bare[-1] == bare_serve.BARE_APP


def test_wrk_summary_counts_only_202s_as_accepted() -> None:
    line = (
        'WRK_JSON {"requests": 110, "accepted": 100, "duration_us": 2000000, '
        '"connect_errors": 1, "read_errors": 2, "write_errors": 0, "status_errors": 10, '
        '"timeouts": 3, "latency_p50_us": 1500, "latency_p99_us": 9000}'
    )
    result = _parse(f"Running 2s test\n{line}\n")
    assert result.accepted_per_s == 50.0
    assert result.errors == 6
    assert (result.latency_p50_ms, result.latency_p99_ms) == (1.5, 9.0)


def test_targets_are_judged_on_the_unrounded_figure() -> None:
    report = {"ratios": {"webhook_vs_bare_flask": 0.849}, "flowforge": {}, "limits": {}}
    verdict = _judge(report, "webhook_vs_bare_flask", ">=", 0.85)
    assert verdict["met"] is False
    report["flowforge"] = {"latency_ms": {"p99": 50.0}}
    assert _judge(report, "latency_ms.p99", "<=", 50)["met"] is True


def test_unmeasured_figures_become_null_in_the_json() -> None:
    assert _clean({"a": [math.nan, 1.0], "b": {"c": math.nan}}) == {
        "a": [None, 1.0],
        "b": {"c": None},
    }


def test_steady_targets_compare_with_the_fastest_peer_and_the_bare_flask_run() -> None:
    def segment(per_s: float, cpu: float, api: float = 0.0, worker: float = 0.0) -> dict:
        return {
            "per_s": per_s,
            "services_cpu_ms": cpu,
            "p50_ms": 4.0,
            "p99_ms": 13.0,
            "cpu_ms": {"api": api, "worker": worker},
        }

    report = {
        "senders_1": segment(124.0, 8.2),
        "senders_8": segment(125.0, 7.9),
        "open_20": segment(20.0, 9.0),
        "open_60": segment(60.0, 8.0, api=2.6, worker=2.0),
        "bare_60": {"cpu_ms": {"bare": 2.0}, "roundtrip_ms": 4.0},
        "roundtrip": {"webhook_ms": 5.2, "healthz_ms": 4.0, "ratio": 1.3},
        "ratios": {"api_vs_bare": 1.3, "worker_vs_bare": 1.0},
    }
    verdicts = {t["figure"]: t["met"] for t in steady.targets(report)}
    assert verdicts == {
        "1 sender: executions/s": True,  # 2 x Procrastinate's 62.0
        "1 sender: machine CPU ms per execution": False,  # 24.3 / 3 = 8.1
        "8 senders: executions/s": False,  # 2 x 62.8
        "8 senders: machine CPU ms per execution": True,  # 23.8 / 3
        "CPU ms per chain3 at 60/s": True,
        "API CPU per webhook / bare Flask": True,  # 1.3, on the bound
        "worker CPU per chain3 / bare Flask": True,
        "webhook round trip / /healthz": True,
        "p50 submit->done at 20/s, ms": True,
        "p99 submit->done at 20/s, ms": False,
    }
    assert steady.percentile([5.0, 1.0, 3.0], 0.5) == 3.0


def test_steady_rounds_are_summed_up_figure_by_figure_as_medians() -> None:
    rounds = [
        {"open_20": {"p50_ms": 9.0, "cpu_ms": {"api": 2.0}}, "name": "a", "ok": True},
        {"open_20": {"p50_ms": 4.0, "cpu_ms": {"api": 3.0}}, "name": "b", "ok": False},
        {"open_20": {"p50_ms": 5.0, "cpu_ms": {"api": 1.0}}, "name": "c", "ok": False},
    ]
    assert steady._medians(rounds) == {
        "open_20": {"p50_ms": 5.0, "cpu_ms": {"api": 2.0}},
        "name": "a",
        "ok": True,
    }
