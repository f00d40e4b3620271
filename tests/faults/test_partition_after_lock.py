"""Issue 23 item 2: a worker partitioned from PostgreSQL right after it took a
concurrency key's slot lock does not take that workflow's intake down.

The fault proxy between the worker and PostgreSQL stops forwarding answers on the link
that sent `pg_advisory_xact_lock` (the slot hand-over, flowcontrol.hand_on), then
strands every link the worker has: the server keeps the half-open sessions, as it would
after a real partition, and its own TCP keepalive would need hours to notice. The
hand-over reads nothing back under the lock: the lock, the hand-over and the COMMIT
travel in one pipeline, so the server commits them whatever becomes of the answers and
no session of the cut-off worker holds the lock (before, the lock's results were read
first and the server held it until the worker's idle_in_transaction_session_timeout).
Webhooks of the workflow, through an API that reaches the server directly, are then
all accepted at once instead of each answering 503 after the API's statement timeout.
"""

from __future__ import annotations

import threading
import time

import psycopg
import requests

from tests.faults.helpers import StartWorker
from tests.support.api import Api
from tests.support.definitions import http, workflow
from tests.support.faultproxy import FaultProxy
from tests.support.processes import wait_for
from tests.support.services import through_proxy
from tests.support.target import Target

WORKER_DB_TIMEOUT_S = 3
# The held lock lives at most the worker's idle-in-transaction timeout; an intake waiting
# for it then commits at once. Generous for a loaded machine, far below the API's 15 s
# statement timeout (its 503) and the server's TCP keepalive (about two hours).
ANSWER_BOUND_S = WORKER_DB_TIMEOUT_S + 5.0
# The slot lock, held by a FlowForge worker session.
WORKER_HOLDS_SLOT_LOCK = """
SELECT a.state FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE 'flowforge-worker%%'
  AND a.datname = current_database()
"""


def test_a_partition_after_the_slot_lock_stops_no_intake_of_its_workflow(
    client: Api,
    db: psycopg.Connection,
    database_url: str,
    pg_proxy: FaultProxy,
    workers: StartWorker,
    target: Target,
) -> None:
    client.publish(
        "keyed",
        {
            **workflow(http("get", "GET", f"{target.url}/keyed/{{{{ input.n }}}}")),
            "concurrency": {"limit": 1, "key": "{{ input.k }}"},
        },
    )
    pg_proxy.drop_replies(after=b"pg_advisory_xact_lock")
    cut_off = workers(
        FLOWFORGE_DATABASE_URL=through_proxy(database_url, pg_proxy),
        FLOWFORGE_DB_TIMEOUT_SECONDS=str(WORKER_DB_TIMEOUT_S),
        FLOWFORGE_WORKER_ID="cut-off",
        # Only the checkpoint that hands the slot on sends the lock: a reconciler pass
        # sending it too would be cut off as well and, queued behind the first session,
        # hold the lock for a second timeout after it (each cut-off session that holds or
        # waits for the lock adds one).
        FLOWFORGE_RECONCILE_SECONDS="60",
    )
    first = client.start("keyed", {"k": "x", "n": 1})
    second = client.start("keyed", {"k": "x", "n": 2})
    # The first one ends and hands its slot on: the link that sent the lock hears
    # nothing back from then on.
    wait_for(
        lambda: pg_proxy.deaf_links > 0,
        timeout=30,
        message="a worker link that sent the slot lock, cut off",
    )
    held_at = time.monotonic()
    pg_proxy.strand()  # the whole worker is partitioned now
    pg_proxy.restore()  # new links pass (stranded ones stay silent)
    time.sleep(0.5)  # past the lock statement itself
    states = db.execute(WORKER_HOLDS_SLOT_LOCK).fetchall()
    # What was sent with the lock included its COMMIT: nothing waits on the cut-off client.
    assert states == [], f"a cut-off worker session holds the slot lock: {states}"

    answers: list[tuple[int, float]] = []

    def hook(n: int) -> None:
        asked = time.monotonic()
        r = requests.post(f"{client.base}/hooks/keyed", json={"k": "x", "n": n}, timeout=30)
        answers.append((r.status_code, time.monotonic() - asked))

    threads = [threading.Thread(target=hook, args=(n,)) for n in (3, 4, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [code for code, _ in answers] == [202, 202, 202], answers
    slowest = max(took for _, took in answers)
    assert slowest < ANSWER_BOUND_S, answers
    freed_s = time.monotonic() - held_at

    # Nothing is lost: a worker that reaches the server settles everything, one at a time.
    workers(FLOWFORGE_WORKER_ID="successor")
    (ids,) = db.execute("SELECT array_agg(id::text) FROM executions").fetchone()
    assert first in ids and second in ids and len(ids) == 5
    for eid in ids:
        assert client.wait(eid, timeout=90)["status"] == "succeeded"
    cut_off.kill()
    print(
        "slot lock sent by a cut-off worker session, committed with it; 3 webhooks of its "
        f"workflow answered 202 in at most {slowest:.1f} s (all within {freed_s:.1f} s)"
    )
