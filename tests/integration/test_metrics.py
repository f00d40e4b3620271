"""Metrics (docs/contract.md#metrics) from real processes: bin/api's /metrics in gunicorn
multiprocess mode (two workers, summed), a bin/worker's own port, values that move as executions
run, and gauge queries that never scan a whole table."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from flowforge.store import gauges
from flowforge.trust import resume_tokens
from tests.support.api import Api
from tests.support.definitions import http, wait, workflow
from tests.support.processes import (
    TEST_RESUME_KEY,
    WORKER,
    Process,
    free_port,
    start_api,
    start_worker,
    wait_for,
)
from tests.support.target import Target

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of a metrics page, parsed by prometheus_client's own parser."""
    answer = requests.get(url, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["Content-Type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample; a KeyError (the series is missing) fails the test."""
    return samples[(name, tuple(sorted(labels.items())))]


def definition(target: Target) -> dict[str, Any]:
    """A wait, then a request whose start measures resume latency."""
    return workflow(
        wait("approval", 300),
        http("ship", "POST", f"{target.url}/ship", after=("approval",)),
        name="approval",
    )


NAP = wait("nap", 0.5, on_timeout="continue")
SHORT_WAIT = workflow(NAP, name="short wait")
TICKING = {"name": "ticking", "trigger": {"schedule": {"every_s": 1}}, "steps": [NAP]}


def metrics_dir(tmp: Path) -> Path:
    """The multiprocess directory bin/api made under its TMPDIR (launcher.py)."""
    (directory,) = tmp.glob("flowforge-api-metrics-*")
    return directory


def accepted_per_file(directory: Path, scratch: Path) -> list[float]:
    """flowforge_webhooks_accepted_total{replayed="false"} as each counter file alone
    says it (prometheus_client's own reader, one file at a time)."""
    counts = []
    for path in sorted(directory.glob("counter_*.db")):
        scratch.mkdir(exist_ok=True)
        for old in scratch.iterdir():
            old.unlink()
        shutil.copy(path, scratch / path.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(scratch))
        counts.append(
            registry.get_sample_value("flowforge_webhooks_accepted_total", {"replayed": "false"})
            or 0.0
        )
    return counts


def test_api_and_worker_metrics_move_as_executions_run(
    env: dict[str, str], api_key: str, target: Target, tmp_path: Path
) -> None:
    api_tmp = tmp_path / "api-tmp"
    api_tmp.mkdir()
    orphan = api_tmp / "flowforge-api-metrics-4194305-left"  # a killed server's (no such pid)
    orphan.mkdir()
    (orphan / "counter_1.db").write_bytes(b"")
    api_proc, api = start_api({**env, "TMPDIR": str(api_tmp)}, tmp_path / "api.log", workers=2)
    port = free_port()
    worker = start_worker(
        {**env, "FLOWFORGE_PUBLIC_URL": api, "FLOWFORGE_METRICS_PORT": str(port)},
        tmp_path / "worker.log",
    )
    worker_metrics = f"http://127.0.0.1:{port}/metrics"
    try:
        client = Api(api, api_key)
        before = scrape(f"{api}/metrics")
        # Zero-valued series exist before anything happened.
        for reason in ("signature", "queue_full", "rate_limited", "not_found"):
            assert value(before, "flowforge_webhooks_refused_total", reason=reason) == 0
        assert value(before, "flowforge_resumes_total", outcome="gone") == 0
        assert value(before, "flowforge_executions", status="needs_attention") == 0
        assert value(before, "flowforge_oldest_ready_step_seconds") == 0
        assert {name for name, _ in before} >= set(gauges.DATABASE_GAUGES) - {
            "flowforge_slot_queue",  # one series per workflow with a concurrency key
            "flowforge_slot_holders",
            "flowforge_work_depth",  # one series per workflow with ready or running steps
        }
        idle = scrape(worker_metrics)
        assert value(idle, "flowforge_attempts_total", type="http_request", outcome="failed") == 0
        assert value(idle, "flowforge_dead_lettered_total", reason="malformed") == 0
        assert value(idle, "flowforge_schedule_ticks_total", outcome="missed") == 0

        client.publish("approval", definition(target))
        client.publish("short", SHORT_WAIT)
        n = 12
        # Concurrent, so that both gunicorn workers serve some: /metrics sums them.
        with ThreadPoolExecutor(6) as pool:
            ids = list(pool.map(lambda i: client.start("approval", {"n": i}), range(n)))
        replayed = client.hook("approval", {"n": 0}, headers={"Idempotency-Key": "k"})
        again = client.hook("approval", {"n": 0}, headers={"Idempotency-Key": "k"})
        assert (replayed.status_code, again.status_code) == (202, 202)
        ids.append(replayed.json()["execution_id"])
        assert client.hook("nosuch", {}).status_code == 404
        assert requests.post(f"{api}/hooks/Not-A-Key!", json={}, timeout=10).status_code == 404
        assert client.hook("approval", None, raw=b"{").status_code == 400
        assert requests.post(f"{api}/hooks/approval?x=1", json={}, timeout=10).status_code == 400
        short = client.start("short", {})

        directory = metrics_dir(api_tmp)  # the orphan is gone: exactly one
        per_worker = accepted_per_file(directory, tmp_path / "one-file")
        for eid in ids:
            client.wait(eid, "waiting")
        assert client.wait(short)["status"] == "succeeded"
        waiting = scrape(f"{api}/metrics")
        accepted = value(waiting, "flowforge_webhooks_accepted_total", replayed="false")
        assert accepted - value(before, "flowforge_webhooks_accepted_total", replayed="false") == (
            n + 2
        )
        assert value(waiting, "flowforge_webhooks_accepted_total", replayed="true") == 1
        # Both gunicorn workers served webhooks, and the page is the sum of their files.
        assert len([c for c in per_worker if c > 0]) >= 2, per_worker
        assert sum(per_worker) == accepted
        assert value(waiting, "flowforge_webhooks_refused_total", reason="not_found") == 2
        assert value(waiting, "flowforge_webhooks_refused_total", reason="bad_request") == 2
        assert value(waiting, "flowforge_waits_open") == n + 1
        assert value(waiting, "flowforge_executions", status="waiting") == n + 1

        key = resume_tokens.parse_key(TEST_RESUME_KEY)
        path = api + resume_tokens.RESUME_PATH
        urls = [path + resume_tokens.token(key, eid, "approval") for eid in ids]
        with ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(lambda u: requests.post(u, json={}, timeout=10), urls))
        assert {r.status_code for r in codes} == {202}
        assert requests.post(urls[0], json={}, timeout=10).status_code == 200
        assert requests.post(urls[0], json={"other": 1}, timeout=10).status_code == 409
        assert requests.post(f"{api}/hooks/resume/x", json={}, timeout=10).status_code == 404
        for eid in ids:
            assert client.wait(eid)["status"] == "succeeded"

        api_after = scrape(f"{api}/metrics")
        assert value(api_after, "flowforge_resumes_total", outcome="accepted") == n + 1
        assert value(api_after, "flowforge_resumes_total", outcome="replayed") == 1
        assert value(api_after, "flowforge_resumes_total", outcome="conflict") == 1
        assert value(api_after, "flowforge_resumes_total", outcome="not_found") == 1
        # The resumes were applied by the API's own unit of work.
        assert value(api_after, "flowforge_waits_ended_total", outcome="resumed") == n + 1
        assert value(api_after, "flowforge_waits_open") == 0
        assert value(api_after, "flowforge_outbox_backlog") == 0

        done = wait_for(
            lambda: (
                (s := scrape(worker_metrics))
                and value(s, "flowforge_execution_duration_seconds_count", status="succeeded")
                == n + 2
                and s
            ),
            message="the worker to count every execution",
        )
        attempts = value(done, "flowforge_attempts_total", type="http_request", outcome="succeeded")
        assert attempts == n + 1
        assert value(done, "flowforge_waits_started_total") == n + 2
        assert value(done, "flowforge_waits_ended_total", outcome="timed_out") == 1
        assert value(done, "flowforge_resume_latency_seconds_count") == n + 1
        assert value(done, "flowforge_step_duration_seconds_count", type="http_request") == n + 1
        assert value(done, "flowforge_timer_lag_seconds_count") >= 1
        # Every http step's wake-up is published; a lone pure step's (the wait's start) may
        # be run by the relay itself instead (Executor.run_pure).
        assert value(done, "flowforge_wakeups_published_total") >= n + 1
        assert value(done, "flowforge_leases_lost_total") == 0
        beats = [k for k in done if k[0] == "flowforge_worker_heartbeat_timestamp_seconds"]
        assert len(beats) == 1 and done[beats[0]] > 0
        assert len(target.requests_to("/ship")) == n + 1

        # A schedule's ticks are counted by outcome, with the lag of each one fired.
        client.publish("tick", TICKING)
        ticked = wait_for(
            lambda: (
                (s := scrape(worker_metrics))
                and value(s, "flowforge_schedule_ticks_total", outcome="fired") >= 2
                and s
            ),
            message="the scheduler to count fired ticks",
        )
        assert value(ticked, "flowforge_schedule_lag_seconds_count") >= 2
        assert value(ticked, "flowforge_schedule_ticks_total", outcome="missed") == 0
    finally:
        code = worker.stop()
        api_proc.stop()
    assert code == 0, worker.log()
    # The worker's server closed with it; the API's metric files went with gunicorn.
    with pytest.raises(requests.ConnectionError):
        requests.get(worker_metrics, timeout=2)
    assert not directory.exists()


def test_a_worker_whose_metrics_port_is_taken_says_so_and_exits(
    env: dict[str, str], tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = Process(WORKER, {**env, "FLOWFORGE_METRICS_PORT": str(port)}, tmp_path / "w.log")
        try:
            code = proc.popen.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        finally:
            proc.stop()
    assert code == 2
    assert f"FLOWFORGE_METRICS_PORT {port} on 127.0.0.1 is in use" in proc.log()


BIG = 20_000


def test_no_gauge_query_scans_a_whole_table(db: psycopg.Connection) -> None:
    """With 20,000 finished executions (and their steps) beside a few live ones, every
    gauge reads the live rows through an index: the plan has no Seq Scan on them."""
    workflow = db.execute("INSERT INTO workflows (key) VALUES ('plan') RETURNING id").fetchone()
    assert workflow is not None
    version = db.execute(
        "INSERT INTO workflow_versions (workflow_id, version, name, definition, webhook_auth) "
        "VALUES (%s, 1, 'plan', %s, 'none') RETURNING id",
        (workflow[0], json.dumps({"steps": []})),
    ).fetchone()
    assert version is not None
    db.execute(
        """
        WITH e AS (
            INSERT INTO executions (id, workflow_id, version_id, status, input, concurrency_key)
            SELECT gen_random_uuid(), %(w)s, %(v)s,
                   CASE WHEN n %% 1000 = 0 THEN 'running' ELSE 'succeeded' END, '{}',
                   CASE WHEN n %% 2 = 0 THEN 'k' END
            FROM generate_series(1, %(n)s) AS n
            RETURNING id, status
        )
        INSERT INTO steps (execution_id, step_id, type, position, status, ready_at)
        SELECT id, 's', 'http_request', 0,
               CASE WHEN status = 'running' THEN 'ready' ELSE 'succeeded' END, now()
        FROM e
        """,
        {"w": workflow[0], "v": version[0], "n": BIG},
    )
    db.execute("ANALYZE executions")
    db.execute("ANALYZE steps")
    for name, query in gauges.GAUGE_QUERIES.items():
        params = {"tables": gauges.ESTIMATED_TABLES} if "%(tables)s" in query else None
        plan = "\n".join(row[0] for row in db.execute("EXPLAIN " + query, params))
        if name == "outbox_backlog":
            # The outbox holds only the unpublished wake-ups: its size is the backlog.
            continue
        for table in ("executions", "steps"):
            assert f"Seq Scan on {table}" not in plan, f"{name}:\n{plan}"
        # outbound_limits holds one row per limit key, and limit_waits only the steps
        # waiting for one (read through its partial index once it has statistics): never
        # analysed here, they are planned as the small tables they are.
        if name not in ("estimated_rows", "outbound"):
            assert "Index" in plan or "Bitmap" in plan, f"{name}:\n{plan}"


def test_with_a_metrics_token_metrics_answer_only_its_bearer(
    env: dict[str, str], tmp_path: Path
) -> None:
    proc, base = start_api({**env, "FLOWFORGE_METRICS_TOKEN": "s3cret-scrape"}, tmp_path / "a.log")
    try:
        refused = [
            requests.get(f"{base}/metrics", headers=headers, timeout=10)
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": "Bearer s3cret-scrap"},
                {"Authorization": "Basic s3cret-scrape"},
                {"Authorization": "s3cret-scrape"},
            )
        ]
        for answer in refused:
            assert answer.status_code == 401, answer.text
            assert answer.headers["Content-Type"] == "application/problem+json"
            assert "flowforge_" not in answer.text
        good = requests.get(
            f"{base}/metrics", headers={"Authorization": "Bearer s3cret-scrape"}, timeout=10
        )
        assert good.status_code == 200 and "flowforge_webhooks" in good.text
        # Liveness and readiness stay open for the load balancer.
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
    finally:
        proc.stop()
