"""bin/api and bin/worker refuse to start when their connections cannot fit in the
server's max_connections, and the defaults of 3 API + 3 worker processes fit in
PostgreSQL's default of 100 (issue 26). Runtime: about 5 s."""

from __future__ import annotations

import subprocess
import sys

import psycopg

from flowforge.store import budget
from flowforge.store.config import Settings
from tests.support.processes import ROOT, WORKER, api_argv, free_port


def _allowed(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(budget.AVAILABLE).fetchone()
    assert row is not None
    return int(row[0])


def test_defaults_of_three_api_and_three_worker_hosts_fit_in_a_default_server() -> None:
    settings = Settings()
    gunicorn_workers = 2 * 2 + 1  # bin/api's default on a 2-core host
    total = 3 * budget.api_budget(settings, gunicorn_workers).connections + 3 * (
        budget.worker_budget(settings).connections
    )
    assert total <= 100 - 3, total  # max_connections 100, 3 kept for superusers


def test_a_worker_that_cannot_fit_refuses_to_start(env: dict[str, str], database_url: str) -> None:
    too_many = _allowed(database_url)  # its pool alone, + LISTEN, is over
    run = subprocess.run(
        WORKER,
        env={**env, "FLOWFORGE_WORKER_POOL_SIZE": str(too_many)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "may open" in run.stderr and "max_connections" in run.stderr


def test_an_api_that_cannot_fit_refuses_to_start(env: dict[str, str], database_url: str) -> None:
    per_worker = _allowed(database_url) // 2 + 1  # two gunicorn workers are over
    run = subprocess.run(
        api_argv(free_port(), 2),
        env={**env, "FLOWFORGE_DB_POOL_SIZE": str(per_worker)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0, run.stderr[-2000:]  # gunicorn's own status for a bad config
    assert "2 gunicorn workers" in run.stderr and "max_connections" in run.stderr


def test_the_budget_tool_prints_a_topology_against_the_server(env: dict[str, str]) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "flowforge.store.budget", "--api", "3", "--workers", "3"],
        env={**env, "FLOWFORGE_WORKER_CONCURRENCY": "8"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert "total" in run.stdout and "allowed" in run.stdout, run.stdout
