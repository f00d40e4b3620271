"""The worker's PostgreSQL link: a blackhole, and a long refusal.

Promises: a connection that stops answering without closing (a partition, a stopped
server, a stuck proxy) never hangs a thread for good — the wait gives up, the attempt is
left to the reaper, and SIGTERM's drain finishes. After the database refused connections
for a long while, the worker's pool is back within seconds of its return, not after a
back-off grown to minutes. The fault proxy sits between the worker and PostgreSQL;
the shared server itself is never stopped.
"""

from __future__ import annotations

import signal
import threading
import time

from flowforge.store.db import create_pool
from tests.faults.helpers import StartWorker, logged
from tests.support.api import Api, step
from tests.support.definitions import http, workflow
from tests.support.faultproxy import FaultProxy
from tests.support.processes import wait_for
from tests.support.services import through_proxy
from tests.support.target import Reply, Target


def test_a_blackholed_database_gives_up_the_checkpoint_and_sigterm_drains(
    client: Api, database_url: str, pg_proxy: FaultProxy, workers: StartWorker, target: Target
) -> None:
    client.publish("fetch", workflow(http("fetch", "GET", f"{target.url}/fetch")))
    target.script = lambda r: Reply(json={"ok": True}, delay_s=2.0)
    cut_off = workers(
        FLOWFORGE_DATABASE_URL=through_proxy(database_url, pg_proxy),
        FLOWFORGE_DB_TIMEOUT_SECONDS="2",
        FLOWFORGE_WORKER_ID="cut-off",
    )
    eid = client.start("fetch", {})
    wait_for(lambda: target.requests_to("/fetch"), message="the request to be in flight")
    # The answer comes back into a worker whose database no longer answers: its
    # checkpoint is sent and waits, as does every other thread's next statement.
    pg_proxy.blackhole()
    time.sleep(2.5)
    cut_off.signal(signal.SIGTERM)
    wait_for(lambda: cut_off.popen.poll() is not None, timeout=60, message="the drain to end")
    assert cut_off.popen.returncode == 0, cut_off.log()[-3000:]
    # The executor thread's checkpoint gave up: the delivery went back, unacknowledged.
    assert logged(cut_off, "database unavailable; delivery handed back")

    # Nothing was lost: once the lease lapsed another worker ran the (safe) GET again.
    pg_proxy.restore()
    workers(FLOWFORGE_WORKER_ID="successor")
    done = client.wait(eid, "succeeded", timeout=30)
    assert [a["outcome"] for a in step(done, "fetch")["attempts"]] == ["lost_lease", "succeeded"]


OUTAGE_S = 18.0  # psycopg_pool's back-off alone tries at ~0, 1, 3, 7, 15, then ~31 s


def test_after_a_long_refusal_the_pool_is_back_within_seconds(
    database_url: str, pg_proxy: FaultProxy
) -> None:
    pool = create_pool(through_proxy(database_url, pg_proxy), max_size=2, name="test-outage")
    pool.open(wait=True, timeout=10)
    stop = threading.Event()
    served: list[float] = []

    def use() -> None:
        """What the worker's threads do: ask for a connection every half second."""
        while not stop.is_set():
            try:
                with pool.connection(timeout=0.5) as conn:
                    conn.execute("SELECT 1")
                served.append(time.monotonic())
            except Exception:  # PoolTimeout, OperationalError: the outage, as the worker sees it
                pass
            stop.wait(0.5)

    user = threading.Thread(target=use, name="user", daemon=True)
    user.start()
    try:
        wait_for(lambda: served, message="the pool to serve")
        pg_proxy.cut()
        time.sleep(OUTAGE_S)
        pg_proxy.restore()
        back = time.monotonic()
        wait_for(
            lambda: served and served[-1] > back,
            timeout=8,
            message="the pool to serve again after the database came back",
        )
        print(f"pool served again {served[-1] - back:.1f} s after a {OUTAGE_S:.0f} s refusal")
    finally:
        stop.set()
        user.join(timeout=5)
        pool.close()
