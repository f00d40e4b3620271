"""Unsafe requests and 202s never outrun the standby, while the rest stays asynchronous
(issue 42, FLOWFORGE_SYNC_UNSAFE_CLAIMS and FLOWFORGE_SYNC_INTAKE).

A primary whose standby is named in synchronous_standby_names but whose own
synchronous_commit is `local`: no commit waits for the standby unless a transaction raises
the level for itself. The standby streams through a fault proxy. One bin/api has
FLOWFORGE_SYNC_INTAKE=on, another does not; the worker has FLOWFORGE_SYNC_UNSAFE_CLAIMS=on.
Webhooks for a workflow that rests 1 s and then POSTs go to the first, webhooks for one
that GETs to the second. The replication link is cut while they arrive, the primary is
killed and the standby promoted. Then:

- every POST reached the target exactly once (a claim the standby lacked never sent it);
- every webhook the first API acknowledged exists on the new primary;
- during the cut the second API still answered 202 and GETs still left: only the
  transactions that asked for it waited.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import requests

from tests.faults.helpers import http, workflow
from tests.support.api import Api
from tests.support.processes import (
    process_env,
    start_api,
    start_worker,
    wait_for,
)
from tests.support.replication import Replicated, migrated_database
from tests.support.target import Target

DB = "ff_sync_unsafe"


def _pay_done(url: str) -> bool:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE e.status <> 'succeeded') FROM executions e"
            " JOIN workflows w ON w.id = e.workflow_id WHERE w.key = 'pay'"
        ).fetchone()
    return bool(row and row[0] == 0)


def _stuck(url: str) -> list[tuple[str, str, str, str | None]]:
    """The pay executions that did not succeed, with each step's status: what a failure
    of the wait above reports."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT e.id::text, e.status, s.step_id || '=' || s.status, s.lease_owner"
            " FROM executions e JOIN workflows w ON w.id = e.workflow_id"
            " JOIN steps s ON s.execution_id = e.id"
            " WHERE w.key = 'pay' AND e.status <> 'succeeded' ORDER BY e.id, s.step_id"
        ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


class Sender:
    """Posts webhooks to one API one after another; remembers the acknowledged ones."""

    def __init__(self, base: str, key: str) -> None:
        self.url = f"{base}/hooks/{key}"
        self.acked: dict[str, float] = {}  # execution id -> time.time() of its 202
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                r = requests.post(self.url, json={"n": n}, timeout=2)
            except requests.RequestException:
                continue
            if r.status_code == 202:
                self.acked[r.json()["execution_id"]] = time.time()
            time.sleep(0.05)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(10)


def test_unsafe_claims_and_acknowledgements_wait_for_the_standby_and_nothing_else(
    amqp_url: str, amqp_prefix: str, tmp_path: Path
) -> None:
    pair = Replicated(synchronous=True, via_proxy=True)
    target = Target()
    try:
        with psycopg.connect(pair.primary.url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_commit = 'local'")
            conn.execute("SELECT pg_reload_conf()")
        _, key = migrated_database(pair.primary.url, DB, "sync")
        new_db = psycopg.conninfo.make_conninfo(pair.standby.url, dbname=DB)
        env = process_env(
            pair.url(DB),
            amqp_url,
            amqp_prefix,
            LEASE_SECONDS="5",
            # Shorter than the cut: a statement timeout must not end a wait for the standby
            # (a cancelled wait commits locally, with only a warning).
            DB_TIMEOUT_SECONDS="2",
        )
        sync_api, sync_base = start_api({**env, "FLOWFORGE_SYNC_INTAKE": "on"}, tmp_path / "a.log")
        async_api, async_base = start_api(env, tmp_path / "b.log")
        worker = start_worker({**env, "FLOWFORGE_SYNC_UNSAFE_CLAIMS": "on"}, tmp_path / "w.log")
        try:
            client = Api(sync_base, key)
            client.publish(
                "pay",
                workflow(
                    {"id": "rest", "type": "delay", "duration_s": 1},
                    http("pay", "POST", f"{target.url}/pay/{{{{ input.n }}}}", after=("rest",)),
                ),
            )
            client.publish(
                "look", workflow(http("look", "GET", f"{target.url}/look/{{{{ input.n }}}}"))
            )
            pay, look = Sender(sync_base, "pay"), Sender(async_base, "look")
            wait_for(lambda: len(target.requests_to("/pay/")) >= 5, timeout=60, message="POSTs")
            assert pair.link is not None
            pair.link.cut()
            cut_at = time.time()
            time.sleep(4)
            pay.finish()
            look.finish()
            killed_at = time.time()
            pair.fail_over()
            try:
                # Generous: recovery after the failover waits out leases and reconnects,
                # slower with the rest of the suite running beside it.
                wait_for(lambda: _pay_done(new_db), timeout=120, interval=0.5, message="pay")
            except AssertionError:
                raise AssertionError(
                    f"not every pay execution succeeded on the new primary: {_stuck(new_db)}"
                ) from None
            with psycopg.connect(new_db, autocommit=True) as conn:
                present = {r[0] for r in conn.execute("SELECT id::text FROM executions")}
        finally:
            worker.stop()
            sync_api.stop()
            async_api.stop()
        posts: dict[str, int] = {}
        for seen in target.requests_to("/pay/"):
            posts[seen.path] = posts.get(seen.path, 0) + 1
        twice = {path: n for path, n in posts.items() if n > 1}
        assert not twice, twice
        assert set(pay.acked) <= present
        # The premise: some POSTs were held back by the cut and sent by the new primary...
        assert any(r.at > killed_at for r in target.requests_to("/pay/"))
        # ...while what did not ask for it kept going: 202s and GETs during the cut.
        assert any(cut_at < at < killed_at for at in look.acked.values())
        assert any(cut_at < r.at < killed_at for r in target.requests_to("/look/"))
        print(
            f"\n{len(posts)} POSTs, none twice; {len(pay.acked)} acknowledged with "
            f"FLOWFORGE_SYNC_INTAKE, none lost; "
            f"{len(set(look.acked) - present)} of {len(look.acked)} lost without it"
        )
    finally:
        target.close()
        pair.stop()
