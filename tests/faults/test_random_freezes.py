"""Issue 39 item 1: no lock is held across a point the server cannot time out.

A busy worker is frozen (SIGSTOP) at 100 random moments (30 in CI) — wherever its threads happen to
be: a claim, a checkpoint, the relay's batch, a reaper pass, a read sent but not fetched,
writes sent but not committed — and during each freeze pg_stat_activity is sampled. A
session that holds a lock while `active` and waiting for the client (ClientRead: a
statement ran and no Sync followed) or `idle` (outside a transaction) is one that neither
statement_timeout nor idle_in_transaction_session_timeout would ever end, and PostgreSQL
15 has no transaction_timeout: there must be none (docs/contract.md#frozen-processes).

Then the same worker is frozen for far longer than its database timeout, at random
moments again, and every execution that was live at that moment is cancelled (or has a
deadline): the frozen execution's own cancel and deadline must take effect within the
bound docs/contract.md#frozen-processes states, not when the worker wakes up.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from typing import Any

import psycopg

from tests.faults.helpers import StartWorker, http, rows, workflow
from tests.support.api import Api
from tests.support.locks import confirmed
from tests.support.target import Reply, Target

SEED = 39
# The long form (FLOWFORGE_TEST_FREEZES=1, outside CI) freezes 100 times and 3 times long;
# CI, 30 and once (about 45 s). A sample can catch a session passing between two states
# (tests/support/locks.py; the likeliest cause of one run in five failing): samples are
# confirmed.
LONG_FORM = os.environ.get("FLOWFORGE_TEST_FREEZES") == "1"
FREEZES = 100 if LONG_FORM else 30
# Short freezes, well inside the database timeout: the server must not end anything, so
# what is sampled is the state the client left, not the timeout's cleanup.
FREEZE_S = 0.25
DB_TIMEOUT_S = 3
LONG_FREEZES = 3 if LONG_FORM else 1
LONG_FREEZE_S = 20.0
DEADLINE_S = 6
# docs/contract.md#frozen-bound: a frozen worker delays its own execution by at most the
# database timeout (a lock it holds) or the lease (a request in flight), plus a reaper pass (2 s
# here) — generous for a busy two-core machine.
OWN_BOUND_S = DB_TIMEOUT_S + 2 + 2 + 5.0
FROZEN_APP = "frozen-worker"
# Sessions of the frozen worker that hold a lock in a state no server timeout covers;
# (pid, state, state_change) first, for tests.support.locks.confirmed.
UNCOVERED = """
SELECT a.pid, a.state, a.state_change, a.wait_event, left(a.query, 60) AS query,
       array_agg(DISTINCT l.locktype) AS locks
FROM pg_stat_activity a
JOIN pg_locks l ON l.pid = a.pid AND l.granted AND l.locktype <> 'virtualxid'
WHERE a.application_name = %(app)s
  AND ((a.state = 'active' AND a.wait_event = 'ClientRead') OR a.state = 'idle')
GROUP BY a.pid, a.state, a.state_change, a.wait_event, a.query
"""
LIVE = """
SELECT id::text FROM executions
WHERE status NOT IN ('succeeded', 'failed', 'cancelled', 'needs_attention')
"""


def _busy_workflow(target: Target) -> dict[str, Any]:
    """Every kind of unit of work: pure steps, a safe and an unsafe request, a delay, a
    small map, a concurrency key's slot."""
    return {
        **workflow(
            {"id": "shape", "type": "transform", "output": {"n": "{{ input.n }}"}},
            http("get", "GET", f"{target.url}/get", after=("shape",)),
            http("post", "POST", f"{target.url}/post", after=("get",), json={}),
            {"id": "pause", "type": "delay", "duration_s": 1, "depends_on": ["post"]},
            {
                "id": "each",
                "type": "map",
                "depends_on": ["pause"],
                "items": "{{ input.items }}",
                "steps": [{"id": "one", "type": "transform", "output": {}}],
            },
        ),
        "deadline_s": DEADLINE_S,
        "concurrency": {"limit": 6, "key": "{{ input.k }}"},
    }


class Feeder:
    """Keeps the worker busy: webhooks at a steady rate from a thread."""

    def __init__(self, client: Api, rate: float) -> None:
        self.client, self.rate = client, rate
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stopped.wait(1 / self.rate):
            n += 1
            try:
                self.client.hook("busy", {"n": n, "k": f"k{n % 3}", "items": [1, 2, 3]})
            except Exception:  # a refused or slow webhook only lowers the load
                continue

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(15)


def _finished_before(db: psycopg.Connection, execution_id: str, answered: float) -> None:
    """A cancelled execution that still succeeded did so in a transaction that began
    before its cancel was answered: the frozen worker's last unit of work, sent whole
    before the stop, commits without it (docs/contract.md#frozen-processes), and a cancel
    that met its row lock is recorded (202) and then finds the execution finished. One
    that finished in a later transaction ignored its cancel. (One long-form run in four
    failed on a plain "not succeeded".)"""
    finished = rows(
        db,
        "SELECT extract(epoch FROM finished_at)::float FROM executions WHERE id = %(id)s",
        {"id": execution_id},
    )[0][0]
    assert finished <= answered, (
        f"{execution_id} succeeded {finished - answered:.1f} s after its cancel"
    )


def test_no_random_freeze_leaves_a_lock_no_timeout_covers(
    client: Api, db: psycopg.Connection, workers: StartWorker, target: Target
) -> None:
    target.script = lambda r: Reply(json={}, delay_s=0.05)
    client.publish("busy", _busy_workflow(target))
    rng = random.Random(SEED)
    timeout = {"FLOWFORGE_DB_TIMEOUT_SECONDS": str(DB_TIMEOUT_S)}
    frozen = workers(PGAPPNAME=FROZEN_APP, **timeout)
    feeder = Feeder(client, rate=25)
    found: list[Any] = []
    try:
        time.sleep(2)
        for _ in range(FREEZES):
            time.sleep(rng.uniform(0.01, 0.3))
            frozen.signal(signal.SIGSTOP)
            try:
                time.sleep(FREEZE_S)  # the server has run whatever reached it
                found += confirmed(lambda: rows(db, UNCOVERED, {"app": FROZEN_APP}))
            finally:
                frozen.signal(signal.SIGCONT)
    finally:
        feeder.stop()
    assert not found, f"{len(found)} samples held locks no server timeout covers: {found[:5]}"

    # Long freezes: another worker carries on; the frozen one's own executions must be
    # stopped (cancel) or failed (deadline) within the stated bound.
    workers(**timeout)
    worst = 0.0
    feeder = Feeder(client, rate=10)
    try:
        for _ in range(LONG_FREEZES):
            time.sleep(rng.uniform(1.0, 2.0))
            frozen.signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            try:
                live = [r[0] for r in rows(db, LIVE)]
                cancelled = live[::2]  # the others end by their deadline
                answered: dict[str, float] = {}
                for execution_id in list(cancelled):
                    answer = client.post(f"/api/v1/executions/{execution_id}/cancel")
                    assert answer.status_code in (200, 202), answer.text
                    answered[execution_id] = time.time()
                    if answer.status_code == 200:
                        # It ended (the other worker runs on) between the listing and the
                        # cancel: the cancel found nothing to stop.
                        cancelled.remove(execution_id)
                for execution_id in live:
                    bound = OWN_BOUND_S + (0 if execution_id in cancelled else DEADLINE_S)
                    left = bound - (time.monotonic() - frozen_at)
                    assert left > 0, f"{execution_id} still live after {bound:.0f} s"
                    ended = client.wait(execution_id, timeout=left)
                    worst = max(worst, time.monotonic() - frozen_at)
                    if ended["status"] == "succeeded" and execution_id in cancelled:
                        _finished_before(db, execution_id, answered[execution_id])
                time.sleep(max(0.0, LONG_FREEZE_S - (time.monotonic() - frozen_at)))
            finally:
                frozen.signal(signal.SIGCONT)
    finally:
        feeder.stop()
    print(
        f"{FREEZES} freezes of {FREEZE_S} s: 0 sessions holding locks uncovered by a "
        f"timeout; in {LONG_FREEZES} freezes of {LONG_FREEZE_S:.0f} s every live execution "
        f"ended within {worst:.1f} s"
    )
