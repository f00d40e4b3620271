"""How fast every console page answers on a database of a million executions.

    .venv/bin/python -m tests.bench.console [--executions 1000000] [--requests 40]

Creates a private, migrated database on the local PostgreSQL and fills it in one
INSERT … SELECT generate_series: five workflows, executions spread over 30 days with
time-ordered (UUIDv7) ids, mostly succeeded, some failed, cancelled, running, waiting,
queued and needs_attention, half with an idempotency key, inputs with a rare value
(`customer.id`, 1 in 10,000) and a common one (`tier`, 1 in 2). The executions'
indexes are dropped for the fill and rebuilt from their own definitions afterwards.
Steps, attempts and events are written for the needs_attention executions (their unknown
steps fill the attention page) and for one execution that the execution page shows.

Then it signs in and asks each page `--requests` times through the Flask app in this
process (no network, the real views, templates and queries) and prints the server
time's p50 and p99 per page. A figure, not a test: nothing is asserted. The database is
dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from typing import Any

import psycopg

from flowforge.api import create_app
from flowforge.store import apikeys
from flowforge.store.config import Settings
from flowforge.store.migrate import migrate
from tests.bench.infra import PrivateDatabase

ADMIN_URL = os.environ.get(
    "FLOWFORGE_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
DEFINITION = """{"name": "bench", "trigger": {"webhook": {"auth": "none"}}, "steps": [
 {"id": "charge", "type": "http_request",
  "request": {"method": "POST", "url": "https://pay.example/charge", "json": {}}},
 {"id": "notify", "type": "transform", "depends_on": ["charge"], "output": {}}]}"""
WORKFLOWS = (
    "INSERT INTO workflows (key, latest_version) SELECT 'wf' || n, 1 FROM generate_series(1, 5) n"
)
VERSIONS = """
INSERT INTO workflow_versions (workflow_id, version, name, definition, webhook_auth)
SELECT id, 1, 'bench', %(definition)s::jsonb, 'none' FROM workflows
"""
# created_at spreads the rows over 30 days; the id carries the same millisecond (UUIDv7).
FILL = """
INSERT INTO executions (id, workflow_id, version_id, status, input, idempotency_key,
                        created_at, updated_at)
SELECT (lpad(to_hex((extract(epoch FROM t.at) * 1000)::bigint), 12, '0')
        || '7' || substr(md5(n::text), 1, 3) || '8' || substr(md5(n::text), 4, 15))::uuid,
       v.workflow_id, v.id,
       CASE WHEN n %% 1000 = 0 THEN 'needs_attention'
            WHEN n %% 1000 < 5 THEN 'queued'
            WHEN n %% 1000 < 10 THEN 'waiting'
            WHEN n %% 1000 < 20 THEN 'running'
            WHEN n %% 1000 < 40 THEN 'cancelled'
            WHEN n %% 1000 < 100 THEN 'failed'
            ELSE 'succeeded' END,
       jsonb_build_object('customer', jsonb_build_object('id', n %% 10000),
                          'tier', CASE WHEN n %% 2 = 0 THEN 'gold' ELSE 'basic' END,
                          'order', n),
       CASE WHEN n %% 2 = 0 THEN 'key-' || n END,
       t.at, t.at
FROM generate_series(1, %(n)s) AS n
CROSS JOIN LATERAL (SELECT now() - interval '30 days'
                           + (interval '30 days' * n / %(n)s) AS at) t
JOIN workflow_versions v ON v.workflow_id = 1 + n %% 5
"""
INDEXES = """
SELECT indexname, indexdef FROM pg_indexes
WHERE tablename = 'executions' AND indexname <> 'executions_pkey'
"""
# The needs_attention executions get their unknown step (and a pending one after it).
STEPS = """
INSERT INTO steps (execution_id, step_id, type, position, status, attempts, error,
                   started_at, finished_at)
SELECT e.id, s.step_id, s.type, s.position,
       CASE WHEN s.position = 0 THEN 'unknown' ELSE 'pending' END,
       CASE WHEN s.position = 0 THEN 1 ELSE 0 END,
       CASE WHEN s.position = 0 THEN 'no response: POST https://pay.example: timed out' END,
       CASE WHEN s.position = 0 THEN e.created_at END,
       CASE WHEN s.position = 0 THEN e.created_at + interval '2 seconds' END
FROM executions e
CROSS JOIN (VALUES ('charge', 'http_request', 0), ('notify', 'transform', 1))
    AS s(step_id, type, position)
WHERE e.status = 'needs_attention'
"""
ATTEMPTS = """
INSERT INTO attempts (execution_id, step_id, attempt, fencing_token, worker, started_at,
                      finished_at, outcome, error)
SELECT execution_id, step_id, 1, 1, 'bench:1', started_at, finished_at, 'unknown', error
FROM steps WHERE status = 'unknown'
"""
EVENTS = """
INSERT INTO execution_events (execution_id, at, step_id, kind, detail)
SELECT execution_id, finished_at, step_id, 'step.unknown',
       '{"from": "running", "to": "unknown"}'::jsonb
FROM steps WHERE status = 'unknown'
"""
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def _fill(url: str, executions: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(WORKFLOWS)
        conn.execute(VERSIONS, {"definition": DEFINITION})
        indexes = conn.execute(INDEXES).fetchall()
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        started = time.monotonic()
        conn.execute(FILL, {"n": executions})
        filled = time.monotonic()
        conn.execute("SET maintenance_work_mem = '256MB'")
        for _, definition in indexes:
            conn.execute(definition)
        for statement in (STEPS, ATTEMPTS, EVENTS):
            conn.execute(statement)
        conn.execute("VACUUM ANALYZE")
        print(
            f"filled {executions} executions in {filled - started:.1f} s, "
            f"indexes and vacuum in {time.monotonic() - filled:.1f} s"
        )


def _sign_in(client: Any, key: str) -> None:
    token = CSRF.search(client.get("/ui/signin").get_data(as_text=True)).group(1)
    assert client.post("/ui/signin", data={"csrf": token, "api_key": key}).status_code == 303


def _pages(conn: psycopg.Connection) -> dict[str, str]:
    (attention_id,) = conn.execute(
        "SELECT execution_id FROM steps WHERE status = 'unknown' LIMIT 1"
    ).fetchone()
    (newest,) = conn.execute("SELECT id FROM executions ORDER BY id DESC LIMIT 1").fetchone()
    day = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 10 * 86400))
    next_day = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 9 * 86400))
    hour_ago = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 3600))
    return {
        "executions": "/ui/executions",
        "executions, page 2": "first-page-cursor",
        "executions ?workflow": "/ui/executions?workflow=wf3",
        "executions ?status=failed": "/ui/executions?status=failed",
        "executions ?status=needs_attention": "/ui/executions?status=needs_attention",
        "executions ?workflow&status=queued": "/ui/executions?workflow=wf2&status=queued",
        "executions ?from&to (1 day)": f"/ui/executions?from={day}&to={next_day}",
        "executions ?idempotency_key": "/ui/executions?idempotency_key=key-500000",
        "executions ?customer.id=42 (rare)": "/ui/executions?path=customer.id&value=42",
        "executions ?tier=gold (half)": '/ui/executions?path=tier&value="gold"',
        "executions ?workflow&failed&rare": (
            "/ui/executions?workflow=wf3&status=failed&path=customer.id&value=42"
        ),
        "execution": f"/ui/executions/{attention_id}",
        "execution live fragment": f"/ui/executions/{attention_id}/live",
        "execution changes (at once)": f"/ui/executions/{attention_id}/changes?wait=0",
        "executions changed since (1 h)": f"/ui/executions/changed?since={hour_ago}",
        "execution (no steps)": f"/ui/executions/{newest}",
        "attention": "/ui/attention",
        "bulk retry preview (all)": "/ui/bulk?action=retry",
        "bulk cancel preview ?workflow": "/ui/bulk?action=cancel&workflow=wf1",
        "workflows": "/ui/workflows",
        "workflow": "/ui/workflows/wf1",
    }


def main() -> None:
    """Fill, measure and print; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--executions", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    database = PrivateDatabase.create(ADMIN_URL)
    url = database.url
    try:
        migrate(url)
        _fill(url, args.executions)
        app = create_app(Settings(database_url=url))
        app.extensions["flowforge.pool"].wait(timeout=10)
        client = app.test_client()
        with psycopg.connect(url, autocommit=True) as conn:
            _, key = apikeys.create(conn, "bench")
            pages = _pages(conn)
        _sign_in(client, key)
        first = client.get("/ui/executions").get_data(as_text=True)
        cursor = re.search(r'id="next-page" href="\?([^"]+)"', first)
        pages["executions, page 2"] = "/ui/executions?" + cursor.group(1).replace("&amp;", "&")
        print(f"{'page':40} {'p50 ms':>8} {'p99 ms':>8}  rows")
        for label, path in pages.items():
            took = []
            for _ in range(args.requests):
                started = time.perf_counter()
                response = client.get(path)
                took.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, (path, response.status_code)
            body = response.get_data(as_text=True)
            rows = body.count('class="mono" href="/ui/executions/')
            quantiles = statistics.quantiles(took, n=100, method="inclusive")
            print(f"{label:40} {quantiles[49]:8.1f} {quantiles[98]:8.1f}  {rows}")
        app.extensions["flowforge.pool"].close()
    finally:
        database.drop()


if __name__ == "__main__":
    main()
