"""The core through a real PgBouncer 1.18 in transaction mode (issue 26).

bin/api and bin/worker reach PostgreSQL through a throwaway PgBouncer whose few server
sessions are shared by all their pooled connections; the relay's LISTEN and bin/migrate
go to FLOWFORGE_DATABASE_DIRECT_URL. Without FLOWFORGE_DATABASE_POOLER the pools' startup
`options` are refused by PgBouncer, and server-side prepared statements would be bound on
the wrong session. Runtime: about 15 s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flowforge.store.db import create_pool, pipelined_transaction
from tests.support.api import Api, step
from tests.support.definitions import http, transform, workflow
from tests.support.pgbouncer import PgBouncer
from tests.support.processes import run_migrate, start_api, start_worker
from tests.support.target import Target

WEBHOOKS = 40


@pytest.fixture
def pgbouncer(pg_admin_url: str) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(pg_admin_url)
    yield bouncer
    bouncer.stop()


@pytest.fixture
def pooled_env(env: dict[str, str], database_url: str, pgbouncer: PgBouncer) -> dict[str, str]:
    return {
        **env,
        "FLOWFORGE_DATABASE_URL": pgbouncer.url(database_url),
        "FLOWFORGE_DATABASE_DIRECT_URL": database_url,
        "FLOWFORGE_DATABASE_POOLER": "transaction",
    }


def test_webhooks_run_to_completion_through_pgbouncer(
    pooled_env: dict[str, str], api_key: str, target: Target, tmp_path: Path
) -> None:
    api_proc, base = start_api(pooled_env, tmp_path / "api.log", workers=3)
    worker = start_worker(pooled_env, tmp_path / "worker.log")
    try:
        client = Api(base, api_key)
        shape = transform("shape", {"n": "{{ input.n }}"})
        call = http("call", "POST", f"{target.url}/n", after=("shape",), json="{{ shape }}")
        client.publish("relay", workflow(shape, call, name="Through the pooler"))

        def send(n: int) -> tuple[int, str]:
            r = client.hook("relay", {"n": n}, headers={"Idempotency-Key": f"k-{n}"})
            return r.status_code, r.text

        # More concurrent senders than the pooler has server sessions.
        with ThreadPoolExecutor(8) as senders:
            answers = list(senders.map(send, range(WEBHOOKS)))
        assert {status for status, _ in answers} == {202}, answers
        # A sender's retry is the same execution (idempotency through the pooler).
        again = [send(n) for n in (0, 1)]
        assert [json.loads(text)["execution_id"] for _, text in again] == [
            json.loads(text)["execution_id"] for _, text in answers[:2]
        ]
        for _, text in answers:
            done = client.wait(json.loads(text)["execution_id"], timeout=60)
            assert done["status"] == "succeeded", done
            assert step(done, "call")["attempts"][0]["http_status"] == 200
        assert len(target.requests_to("/n")) == WEBHOOKS
        for log in (api_proc.log(), worker.log()):
            assert "prepared statement" not in log
            assert "unsupported startup parameter" not in log
    finally:
        worker.stop()
        api_proc.stop()


def test_pooled_transactions_carry_their_own_timeouts(
    database_url: str, pgbouncer: PgBouncer
) -> None:
    pool = create_pool(
        pgbouncer.url(database_url), max_size=6, min_size=6, name="t", timeout_s=4, pooler=True
    )
    pool.open(wait=True, timeout=10)
    try:

        def both_ways(_: int) -> tuple[str, str, str]:
            with pool.connection() as conn, conn.transaction():
                plain = conn.execute("SHOW statement_timeout").fetchone()
            with pool.connection() as conn, pipelined_transaction(conn):
                piped = conn.execute("SHOW idle_in_transaction_session_timeout")
            with pool.connection() as conn:
                # The same statement again and again from six clients on three server
                # sessions: prepared on the server, it would be missing on another one.
                for _ in range(8):
                    conn.execute("SELECT %(x)s::int + 1", {"x": 1}).fetchone()
            assert plain is not None
            return plain[0], piped.fetchone()[0], "ok"

        with ThreadPoolExecutor(6) as threads:
            results = set(threads.map(both_ways, range(60)))
        assert results == {("4s", "4s", "ok")}
    finally:
        pool.close()


def test_bin_migrate_takes_its_lock_on_the_direct_url(
    pooled_env: dict[str, str], pgbouncer: PgBouncer, new_database_url: str
) -> None:
    direct = new_database_url
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")},
        **pooled_env,
        "FLOWFORGE_DATABASE_URL": pgbouncer.url(direct),
        "FLOWFORGE_DATABASE_DIRECT_URL": direct,
    }
    run = run_migrate(env, "--create", timeout=120)
    assert run.returncode == 0, run.stderr
    assert "applied" in run.stdout
    again = run_migrate(env)
    assert again.returncode == 0 and "applied 0 migration(s)" in again.stdout, again


def test_a_pooler_without_a_direct_url_is_refused(
    pooled_env: dict[str, str],
) -> None:
    env = {**pooled_env}
    del env["FLOWFORGE_DATABASE_DIRECT_URL"]
    run = run_migrate(env)
    assert run.returncode == 1
    assert "FLOWFORGE_DATABASE_DIRECT_URL" in run.stderr
