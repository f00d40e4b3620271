"""Issue 39 item 5: a backlog does not multiply wake-ups.

A worker that drains slower than webhooks arrive builds a queue longer than
FLOWFORGE_RECONCILE_SECONDS. Its steps wait `ready` for longer than that interval while
their first wake-up is still queued; the reconciler used to count each as lost and publish
another (3 per execution at 10x the drain rate), each costing the consumer a claim. A
wake-up still in the queue is not lost: none is published again. A wake-up that really is
lost in a backlog (the queue purged) is still found, and every execution finishes.
"""

from __future__ import annotations

import time

from tests.faults.helpers import StartWorker, channel, http, logged, workflow
from tests.support.api import Api
from tests.support.processes import Process, wait_for
from tests.support.target import Reply, Target

RUNS = 60  # at about 6 a second: a backlog of about 10 s, five reconcile intervals


def _redispatched(worker: Process) -> int:
    return sum(r.get("count", 0) for r in logged(worker, "re-dispatched ready steps"))


def _all_succeeded(client: Api, ids: list[str]) -> bool:
    return all(client.execution(eid)["status"] == "succeeded" for eid in ids)


def test_a_backlog_longer_than_the_reconcile_interval_publishes_no_extra_wakeups(
    client: Api, workers: StartWorker, target: Target
) -> None:
    client.publish("slow", workflow(http("get", "GET", f"{target.url}/get/{{{{ input.n }}}}")))
    target.script = lambda r: Reply(json={}, delay_s=0.15)
    worker = workers(FLOWFORGE_WORKER_CONCURRENCY="1")
    started = time.monotonic()
    ids = [client.start("slow", {"n": n}) for n in range(RUNS)]
    wait_for(lambda: _all_succeeded(client, ids), timeout=120, message="the backlog drained")
    drained_s = time.monotonic() - started
    assert drained_s > 3 * 2, f"no backlog beyond the reconcile interval ({drained_s:.1f} s)"
    assert _redispatched(worker) == 0, logged(worker, "re-dispatched ready steps")
    assert len(target.received) == RUNS
    print(f"a backlog of {RUNS} drained in {drained_s:.1f} s with no wake-up published twice")


def test_a_wakeup_lost_in_a_backlog_is_still_found(
    client: Api, workers: StartWorker, target: Target, amqp_url: str, amqp_prefix: str
) -> None:
    client.publish("slow", workflow(http("get", "GET", f"{target.url}/get/{{{{ input.n }}}}")))
    target.script = lambda r: Reply(json={}, delay_s=0.15)
    worker = workers(FLOWFORGE_WORKER_CONCURRENCY="1")
    ids = [client.start("slow", {"n": n}) for n in range(RUNS)]
    wait_for(lambda: len(target.received) >= 5, timeout=30, message="the backlog to start")
    with channel(amqp_url) as ch:
        ch.queue_purge(f"{amqp_prefix}.steps")
    wait_for(lambda: _all_succeeded(client, ids), timeout=120, message="every execution")
    assert _redispatched(worker) > 0
    assert len(target.received) == RUNS
