"""The failover report flags every request the new primary sends again (issue 42).

A primary and an asynchronous standby that streams through a fault proxy; bin/api and
bin/worker use the multi-host URL. Webhooks arrive for a workflow that rests 2 s, then
GETs the target (which answers after 3 s). Two kinds of loss are set up by cutting the
replication link, letting the old primary finish everything, then killing it and
promoting the standby:

- batch A: the claims reached the standby, the outcomes did not — the new primary has
  each step running, leased for 120 s to a worker that is alive and holds nothing;
- batch B: the executions reached the standby, the claims did not — the new primary
  claims again under the very fencing token the old one used.

Each GET the new primary sends again is counted at the target; the report, run against
the restarted old primary, must flag an attempt of every such execution, and batch A must
be recovered without waiting out its lease (the test gives it 60 s of a 120 s lease).
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import requests

from flowforge.store.failover import report
from tests.faults.helpers import http, workflow
from tests.support.api import Api
from tests.support.processes import (
    process_env,
    start_api,
    start_worker,
    wait_for,
)
from tests.support.replication import Replicated, migrated_database
from tests.support.target import Reply, Target

DB = "ff_resends"
BATCH = 5


def _count(url: str, sql: str) -> int:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def test_the_report_flags_every_request_sent_again_after_a_failover(
    amqp_url: str, amqp_prefix: str, tmp_path: Path
) -> None:
    pair = Replicated(via_proxy=True)
    target = Target()
    target.script = lambda _r: Reply(json={"ok": True}, delay_s=3.0)
    try:
        old_db, key = migrated_database(pair.primary.url, DB, "resends")
        new_db = psycopg.conninfo.make_conninfo(pair.standby.url, dbname=DB)
        env = process_env(
            pair.url(DB),
            amqp_url,
            amqp_prefix,
            LEASE_SECONDS="120",
            WORKER_CONCURRENCY=str(2 * BATCH),
        )
        api_proc, base = start_api(env, tmp_path / "api.log")
        worker = start_worker(env, tmp_path / "worker.log")
        try:
            Api(base, key).publish(
                "t",
                workflow(
                    {"id": "rest", "type": "delay", "duration_s": 2},
                    http("fetch", "GET", f"{target.url}/r/{{{{ input.n }}}}", after=("rest",)),
                ),
            )
            by_n: dict[str, str] = {}

            def post(n: int) -> None:
                r = requests.post(f"{base}/hooks/t", json={"n": n}, timeout=10)
                assert r.status_code == 202, r.text
                by_n[f"/r/{n}"] = r.json()["execution_id"]

            for n in range(BATCH):
                post(n)
            wait_for(
                lambda: (
                    _count(
                        new_db,
                        "SELECT count(*) FROM steps WHERE step_id = 'fetch' AND status = 'running'",
                    )
                    == BATCH
                ),
                timeout=30,
                message="batch A's claims on the standby",
            )
            for n in range(BATCH, 2 * BATCH):
                post(n)
            wait_for(
                lambda: _count(new_db, "SELECT count(*) FROM executions") == 2 * BATCH,
                timeout=30,
                message="batch B's executions on the standby",
            )
            assert pair.link is not None
            pair.link.cut()
            wait_for(
                lambda: (
                    _count(old_db, "SELECT count(*) FROM executions WHERE status = 'succeeded'")
                    == 2 * BATCH
                ),
                timeout=60,
                message="every execution done on the old primary",
            )
            assert len(target.received) == 2 * BATCH
            pair.fail_over()
            wait_for(
                lambda: (
                    _count(new_db, "SELECT count(*) FROM executions WHERE status = 'succeeded'")
                    == 2 * BATCH
                ),
                timeout=60,
                interval=0.5,
                message="every execution done again on the new primary, within half a lease",
            )
        finally:
            worker.stop()
            api_proc.stop()
        sent: dict[str, int] = {}
        for seen in target.received:
            sent[seen.path] = sent.get(seen.path, 0) + 1
        resent = {by_n[path] for path, times in sent.items() if times > 1}
        assert len(resent) == 2 * BATCH, sent  # the test's own premise: every GET went twice

        old = pair.restart_old_primary()
        found = report(psycopg.conninfo.make_conninfo(old.url, dbname=DB), new_db, minutes=60)
        flagged = {
            a["execution_id"]: a["lost"]
            for a in found["missing_attempts"]
            if a["request_may_have_left"]
        }
        assert resent <= set(flagged), found
        assert {flagged[by_n[f"/r/{n}"]] for n in range(BATCH)} == {"outcome"}
        assert {flagged[by_n[f"/r/{n}"]] for n in range(BATCH, 2 * BATCH)} == {"attempt"}
        assert not found["missing_executions"]
        kinds = list(flagged.values())
        print(
            f"\nlink cut, then primary lost: {len(resent)} GETs sent again by the new primary; "
            f"report flagged {len(resent & set(flagged))} of them ({kinds.count('outcome')} "
            f"outcome lost, {kinds.count('attempt')} claim lost)"
        )
    finally:
        target.close()
        pair.stop()
