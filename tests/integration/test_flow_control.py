"""docs/contract.md#flow-control: concurrency slots per workflow and per key, on_full and
max_queued across API processes through real bin/api and bin/worker processes (the point is
steps running at once); deadlines, queue expiry and retry budgets in the test's process
(`in_process`: the API app, the executor and the timer scan)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from tests.support.api import Api, step
from tests.support.definitions import unsigned
from tests.support.inprocess import InProcess
from tests.support.processes import Process, start_api, wait_for
from tests.support.target import Received, Reply, Target


class Gauge:
    """Counts requests in progress at the target, overall and per key, and the peaks.

    The reply is sent only after the request leaves the gauge, so a worker can never
    start the next request of a slot while the previous one still counts."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.lock = threading.Lock()
        self.active: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)
        self.overall = 0
        self.overall_peak = 0
        self.release = threading.Event()

    def __call__(self, received: Received) -> Reply:
        key = received.path.rsplit("/", 1)[-1]
        with self.lock:
            self.active[key] += 1
            self.overall += 1
            self.peak[key] = max(self.peak[key], self.active[key])
            self.overall_peak = max(self.overall_peak, self.overall)
        self.release.wait(self.hold_s)
        with self.lock:
            self.active[key] -= 1
            self.overall -= 1
        return Reply(json={"ok": True})


def flow(steps: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    return unsigned(steps, "flow", **options)


def get(url: str, **extra: Any) -> dict[str, Any]:
    return {"id": "call", "type": "http_request", "request": {"method": "GET", "url": url}, **extra}


def post(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "call",
        "type": "http_request",
        "request": {"method": "POST", "url": url, "json": {"n": "{{ input.n }}"}},
        **extra,
    }


def gated(
    client: Api | InProcess,
    target: Target,
    workflow: str,
    hold_s: float,
    method: str = "GET",
    start_within_s: float | None = None,
    **concurrency: Any,
) -> Gauge:
    """Publish `workflow`: one call (GET, or POST with input.n) to the target's
    /sync/<the concurrency key, or x> under these concurrency settings; the target holds
    each request `hold_s` in the gauge returned."""
    gauge = Gauge(hold_s)
    target.script = gauge
    url = f"{target.url}/sync/{concurrency.get('key', 'x')}"
    expiry = {} if start_within_s is None else {"start_within_s": start_within_s}
    call = post(url) if method == "POST" else get(url)
    client.publish(workflow, flow([call], concurrency=concurrency, **expiry))
    return gauge


def one_post_in_flight(
    client: Api, target: Target, workers: Callable[..., Process], workflow: str, on_full: str
) -> tuple[Gauge, str]:
    """`workflow` (one POST, limit 1, `on_full`) published, a worker started and one
    execution (n 1) started: the gauge and the execution's id once its POST is held (until
    the test sets gauge.release)."""
    gauge = gated(client, target, workflow, 30.0, method="POST", limit=1, on_full=on_full)
    workers()
    execution_id = client.start(workflow, {"n": 1})
    wait_for(lambda: target.received, message="the first POST")
    return gauge, execution_id


def counted(db: psycopg.Connection, condition: str) -> int:
    """How many executions meet `condition` (one of this file's constant SQL conditions)."""
    (count,) = db.execute(f"SELECT count(*) FROM executions WHERE {condition}").fetchone()
    return int(count)


def events(execution: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in execution["events"] if e["kind"] == kind]


@pytest.fixture
def client(api: str, api_key: str) -> Api:
    return Api(api, api_key)


def test_a_limit_holds_at_the_target_through_a_worker_sigkill_and_nothing_is_stranded(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    gauge = gated(client, target, "limited", 0.4, limit=2)
    ids = [client.start("limited", {"n": n}) for n in range(12)]
    queued = client.execution(ids[-1])
    assert queued["status"] == "queued"
    waiting = queued["flow_control"]["waiting_for_slot"]
    assert waiting["key"] == "" and waiting["limit"] == 2
    assert waiting["ahead"] == 9 and len(waiting["held_by"]) == 2
    metrics = requests.get(f"{client.base}/metrics", timeout=10).text
    assert 'flowforge_slot_queue{workflow="limited"} 10.0' in metrics
    assert 'flowforge_slot_holders{workflow="limited"} 2.0' in metrics
    victim = workers()
    workers()
    wait_for(lambda: len(target.received) >= 4, timeout=20, message="4 requests")
    victim.kill()
    for eid in ids:
        assert client.wait(eid, timeout=40)["status"] == "succeeded"
    assert gauge.overall_peak == 2


def test_per_key_limits_serialise_each_key_while_keys_run_in_parallel(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    gauge = gated(client, target, "per-key", 0.3, limit=1, key="{{ input.customer }}")
    # A body the key cannot be rendered from is refused, creating nothing.
    refused = client.hook("per-key", {"name": "no customer"})
    assert refused.status_code == 422, refused.text
    assert refused.headers["Content-Type"] == "application/problem+json"
    assert "input.customer" in refused.json()["detail"]
    workers()
    ids = [client.start("per-key", {"customer": c}) for _ in range(5) for c in ("a", "b", "c")]
    for eid in ids:
        assert client.wait(eid, timeout=40)["status"] == "succeeded"
    assert len(target.received) == 15
    assert dict(gauge.peak) == {"a": 1, "b": 1, "c": 1}
    assert gauge.overall_peak >= 2


def test_a_quiet_key_is_not_starved_by_a_busy_one(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    gated(client, target, "fair", 0.2, limit=1, key="{{ input.customer }}")
    workers()
    busy = [client.start("fair", {"customer": "busy"}) for _ in range(15)]
    quiet = client.start("fair", {"customer": "quiet"})
    done = client.wait(quiet, timeout=20)
    assert done["status"] == "succeeded"
    # The quiet key's one execution finished while most of the busy key still waited.
    still_queued = [e for e in busy if client.execution(e)["status"] == "queued"]
    assert len(still_queued) >= 5
    for eid in busy:
        assert client.wait(eid, timeout=40)["status"] == "succeeded"


def test_drop_new_records_the_new_execution_cancelled_with_reason_concurrency(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    gauge, first = one_post_in_flight(client, target, workers, "drop", "drop_new")
    r = client.hook("drop", {"n": 2})
    assert r.status_code == 202
    dropped = client.execution(r.json()["execution_id"])
    assert dropped["status"] == "cancelled"
    assert dropped["flow_control"]["stop_reason"] == "concurrency"
    assert events(dropped, "execution.cancelled")[0]["detail"]["reason"] == "concurrency"
    assert step(dropped, "call")["status"] == "cancelled"
    # An operator retry takes a slot like any start: refused while the slot is held.
    retry = client.post(f"/api/v1/executions/{dropped['id']}/retry")
    assert retry.status_code == 409, retry.text
    gauge.release.set()
    assert client.wait(first)["status"] == "succeeded"
    assert len(target.received) == 1
    assert client.post(f"/api/v1/executions/{dropped['id']}/retry").status_code == 202
    assert client.wait(dropped["id"])["status"] == "succeeded"
    assert len(target.received) == 2


def test_cancel_oldest_lets_the_unsafe_post_in_flight_finish_before_the_new_one_starts(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    gauge, oldest = one_post_in_flight(client, target, workers, "newest", "cancel_oldest")
    newest = client.start("newest", {"n": 2})
    # The slot is held until the oldest is terminal (docs/contract.md#slots): the new one waits
    # queued while the old POST is still in flight at the target, then starts.
    assert client.execution(newest)["status"] == "queued"
    assert client.execution(oldest)["cancel_requested_at"] is not None
    time.sleep(1.0)  # room for a wrongly started POST to arrive
    gauge.release.set()
    old = client.wait(oldest, "cancelled")
    # The POST that was in flight finished and is recorded: its effect happened.
    assert step(old, "call")["status"] == "succeeded"
    assert old["flow_control"]["stop_reason"] == "concurrency"
    assert events(old, "execution.cancelled")[0]["detail"]["reason"] == "concurrency"
    assert client.wait(newest)["status"] == "succeeded"
    assert [r.json()["n"] for r in target.received] == [1, 2]
    assert gauge.overall_peak == 1


def test_a_cancelled_execution_holds_its_slot_until_its_request_in_flight_ends(
    client: Api, target: Target, workers: Callable[..., Process], db: psycopg.Connection
) -> None:
    gauge = gated(client, target, "two", 30.0, method="POST", limit=2)
    workers()
    first, second, third = (client.start("two", {"n": n}) for n in range(3))
    wait_for(lambda: len(target.received) == 2, message="two POSTs in flight")
    answer = client.post(f"/api/v1/executions/{first}/cancel")
    assert answer.status_code == 202, answer.text
    # Asked to stop, but its POST is still in flight: it keeps the slot, the third waits.
    assert client.execution(first)["status"] == "running"
    assert client.execution(third)["status"] == "queued"
    (holders,) = db.execute(
        "SELECT count(*) FROM executions WHERE slot_at IS NOT NULL AND status = 'running'"
    ).fetchone()
    assert holders == 2
    time.sleep(1.0)  # room for a wrongly started POST to arrive
    gauge.release.set()
    assert client.wait(first, "cancelled")["status"] == "cancelled"
    assert client.wait(second)["status"] == "succeeded"
    assert client.wait(third)["status"] == "succeeded"
    assert len(target.received) == 3
    assert gauge.overall_peak == 2


def test_cancel_other_never_has_two_posts_of_one_schedule_in_flight(
    client: Api, target: Target, workers: Callable[..., Process], db: psycopg.Connection
) -> None:
    gauge = Gauge(hold_s=2.5)
    target.script = gauge
    client.publish(
        "ticking",
        {
            "name": "ticking",
            "trigger": {
                "webhook": {"auth": "none"},
                "schedule": {"every_s": 1, "overlap": "cancel_other"},
            },
            "steps": [
                {
                    "id": "call",
                    "type": "http_request",
                    "request": {"method": "POST", "url": f"{target.url}/sync/x", "json": {}},
                }
            ],
        },
    )
    workers()

    wait_for(
        lambda: counted(db, "stop_reason = 'concurrency'") >= 3 and len(target.received) >= 2,
        timeout=30,
        message="ticks",
    )
    assert client.post("/api/v1/workflows/ticking/schedule/pause").status_code == 200
    wait_for(lambda: counted(db, "finished_at IS NULL") == 0, timeout=30, message="all ended")
    # Each tick cancelled the one before; a POST in flight finished before the next left.
    assert gauge.overall_peak == 1


def test_max_queued_refuses_at_the_same_count_from_two_api_processes_creating_nothing(
    client: Api,
    target: Target,
    workers: Callable[..., Process],
    env: dict[str, str],
    tmp_path: Path,
    db: psycopg.Connection,
) -> None:
    gauge = gated(client, target, "bounded", 20.0, limit=1, max_queued=3)
    second, base2 = start_api(env, tmp_path / "api2.log")
    try:
        apis = [client.base, base2]

        def hook(n: int, key: str) -> requests.Response:
            return requests.post(
                f"{apis[n % 2]}/hooks/bounded",
                json={"n": n},
                headers={"Idempotency-Key": key},
                timeout=10,
            )

        answers = [hook(n, f"k{n}") for n in range(6)]
        assert [a.status_code for a in answers] == [202, 202, 202, 202, 429, 429]
        for refused in answers[4:]:
            assert refused.headers["Content-Type"] == "application/problem+json"
            assert 1 <= int(refused.headers["Retry-After"]) <= 60
            assert refused.json()["status"] == 429
        (count,) = db.execute("SELECT count(*) FROM executions").fetchone()
        assert count == 4
        (keys,) = db.execute("SELECT count(*) FROM idempotency_keys").fetchone()
        assert keys == 4
        # A replay of an accepted webhook is still answered while the queue is full.
        replay = hook(3, "k3")
        assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
        workers()
        gauge.release.set()
        for a in answers[:4]:
            assert client.wait(a.json()["execution_id"])["status"] == "succeeded"
        # Nothing was kept of the refused ones: the same key is a new execution now.
        assert hook(5, "k5").status_code == 202
    finally:
        second.stop()


def test_deadline_during_a_delay_fails_the_execution_with_reason_deadline(
    in_process: InProcess,
) -> None:
    in_process.publish(
        "late-delay",
        flow([{"id": "nap", "type": "delay", "duration_s": 60}], deadline_s=1),
    )
    done = in_process.wait(in_process.start("late-delay", {}), timeout=15)
    assert done["status"] == "failed"
    assert done["flow_control"]["stop_reason"] == "deadline"
    assert events(done, "execution.deadline_passed")
    assert events(done, "execution.failed")[0]["detail"]["reason"] == "deadline"
    assert step(done, "nap")["status"] == "cancelled"


def test_deadline_during_back_off_stops_the_retries(in_process: InProcess, target: Target) -> None:
    target.script = lambda r: Reply(status=503)
    in_process.publish(
        "late-retry",
        flow(
            [
                get(
                    f"{target.url}/flaky",
                    retry={"max_attempts": 5, "initial_interval_s": 30, "max_interval_s": 60},
                )
            ],
            deadline_s=2,
        ),
    )
    done = in_process.wait(in_process.start("late-retry", {}), timeout=15)
    assert done["status"] == "failed"
    assert events(done, "execution.failed")[0]["detail"]["reason"] == "deadline"
    assert step(done, "call")["status"] == "cancelled"
    assert len(target.received) == 1


def test_deadline_during_an_unsafe_post_lets_it_finish_and_records_it(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    gauge = Gauge(hold_s=3.0)
    target.script = gauge
    client.publish(
        "late-post",
        flow(
            [
                post(f"{target.url}/sync/x"),
                {"id": "after", "type": "transform", "depends_on": ["call"], "output": {}},
            ],
            deadline_s=1,
        ),
    )
    workers()
    eid = client.start("late-post", {"n": 1})
    wait_for(lambda: target.received, message="the POST")
    time.sleep(1.5)
    during = client.execution(eid)
    assert during["status"] == "running"  # the request in flight is left to finish
    done = client.wait(eid, timeout=15)
    assert done["status"] == "failed"
    assert done["flow_control"]["stop_reason"] == "deadline"
    assert step(done, "call")["status"] == "succeeded"
    assert step(done, "after")["status"] == "cancelled"
    assert len(target.received) == 1


def test_start_within_expires_an_execution_queued_behind_a_limit(
    in_process: InProcess, target: Target
) -> None:
    gated(in_process, target, "expiring", 4.0, start_within_s=1, limit=1)
    first = in_process.start("expiring", {})
    second = in_process.start("expiring", {})
    expired = in_process.wait(second, timeout=15)
    assert expired["status"] == "cancelled"
    assert expired["flow_control"]["stop_reason"] == "expired"
    assert events(expired, "execution.cancelled")[0]["detail"]["reason"] == "expired"
    assert in_process.wait(first, timeout=15)["status"] == "succeeded"
    assert len(target.received) == 1


def test_budget_fails_at_once_on_a_retry_after_beyond_it(
    in_process: InProcess, target: Target
) -> None:
    target.script = lambda r: Reply(status=503, headers={"Retry-After": "3600"})
    in_process.publish(
        "budgeted",
        flow(
            [
                get(
                    f"{target.url}/busy",
                    budget_s=60,
                    retry={"max_attempts": 5, "max_interval_s": 7200},
                )
            ]
        ),
    )
    done = in_process.wait(in_process.start("budgeted", {}), timeout=15)
    assert done["status"] == "failed"
    error = step(done, "call")["error"]
    assert "Retry-After 3600" in error and "budget_s 60" in error, error
    assert len(target.received) == 1


def test_budget_shrinks_the_timeout_of_the_last_attempt(
    in_process: InProcess, target: Target
) -> None:
    target.script = lambda r: Reply(json={}, delay_s=2.5)
    in_process.publish(
        "shrinking",
        flow(
            [
                {
                    "id": "call",
                    "type": "http_request",
                    "request": {"method": "GET", "url": f"{target.url}/slow", "timeout_s": 2},
                    "budget_s": 3,
                    "retry": {"max_attempts": 5, "initial_interval_s": 0.1},
                }
            ]
        ),
    )
    done = in_process.wait(in_process.start("shrinking", {}), timeout=20)
    assert done["status"] == "failed"
    attempts = step(done, "call")["attempts"]
    assert len(attempts) == 2, attempts
    first, last = (
        (datetime.fromisoformat(a["finished_at"]) - datetime.fromisoformat(a["started_at"]))
        for a in attempts
    )
    # The first try had its whole timeout; the second only what was left of budget_s.
    assert first.total_seconds() >= 1.9 and last.total_seconds() < 1.5, attempts


def test_racing_cancel_oldest_webhooks_end_with_the_key_at_its_limit(
    client: Api, target: Target, workers: Callable[..., Process], db: psycopg.Connection
) -> None:
    gauge = gated(client, target, "racing", 20.0, limit=2, on_full="cancel_oldest")
    answers: list[int] = []
    threads = [
        threading.Thread(target=lambda: answers.append(client.hook("racing", {}).status_code))
        for _ in range(10)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [202] * 10
    (held,) = db.execute(
        "SELECT count(*) FROM executions WHERE slot_at IS NOT NULL"
        " AND cancel_requested_at IS NULL AND status NOT IN ('succeeded', 'failed', 'cancelled')"
    ).fetchone()
    assert held == 2
    (replaced,) = db.execute(
        "SELECT count(*) FROM executions WHERE stop_reason = 'concurrency'"
    ).fetchone()
    assert replaced == 8
    workers()
    gauge.release.set()
    wait_for(lambda: counted(db, "status = 'succeeded'") == 2, timeout=20, message="2 succeeded")
    assert len(target.received) == 2
