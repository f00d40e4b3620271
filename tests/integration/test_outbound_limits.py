"""Outbound limits shared by the cluster (docs/contract.md#outbound-limits), through real bin/api
and two real bin/worker processes: a rate never exceeded across workers, a waiting step that is
still `ready` and no attempt, and a 429 with Retry-After that holds the key for everyone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from tests.support.api import Api, step
from tests.support.definitions import unsigned
from tests.support.processes import Process, wait_for
from tests.support.target import Received, Reply, Target, first_then_ok, most_in_any_second

COUNT_SUCCEEDED = "SELECT count(*) FROM executions WHERE status = 'succeeded'"


def limited(url: str, limits: dict[str, Any], limit: str) -> dict[str, Any]:
    definition = unsigned(
        [{"id": "call", "type": "http_request", "limit": limit, "request": {"url": url}}]
    )
    return {**definition, "limits": limits}


def test_a_rate_limit_holds_across_two_workers_and_waiting_is_no_attempt(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    rate, count = 5, 30
    # A lease longer than the suite's 2 s: on a busy machine a claim that waited for the
    # key's row lock must not be kept home by the lease fence (which is an attempt).
    for _ in range(2):
        workers(FLOWFORGE_WORKER_CONCURRENCY="8", FLOWFORGE_LEASE_SECONDS="10")
    client = Api(api, api_key)
    client.publish(
        "partner",
        limited(f"{target.url}/rated", {"partner": {"rate_per_s": rate, "burst": 1}}, "partner"),
    )
    with ThreadPoolExecutor(4) as starters:
        ids = list(starters.map(lambda n: client.start("partner", {"n": n}), range(count)))
    wait_for(
        lambda: db.execute(COUNT_SUCCEEDED).fetchone()[0] == count,
        timeout=60,
        message="every execution to succeed",
    )
    arrivals = [r.at for r in target.requests_to("/rated")]
    assert len(arrivals) == count
    # GCRA with burst 1: at most rate + 1 leave in any second; one more for the moment a
    # request takes from its admission to the target (thread scheduling on a busy box).
    offsets = [round(t - min(arrivals), 2) for t in sorted(arrivals)]
    assert most_in_any_second(arrivals) <= rate + 1 + 1, offsets
    # 30 requests at 5/s cannot all have been sent in less than ~5.8 s.
    assert max(arrivals) - min(arrivals) >= (count - 1) / rate - 0.3
    # Waiting was neither an attempt nor a failure, and it is in the history.
    waited = [client.execution(eid) for eid in ids]
    tries = [step(e, "call")["attempts"] for e in waited]
    assert all(len(attempts) == 1 for attempts in tries), [a for a in tries if len(a) != 1]
    kinds = [[event["kind"] for event in e["events"]] for e in waited]
    assert sum("step.limited" in k for k in kinds) >= count // 2, kinds


def test_a_429_with_retry_after_holds_the_key_for_every_execution(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    target.script = first_then_ok(
        Reply(status=429, headers={"Retry-After": "3"}, json={"slow": "down"})
    )
    workers()
    client = Api(api, api_key)
    client.publish("quota", limited(f"{target.url}/quota", {"quota": {"concurrency": 10}}, "quota"))
    eid = client.start("quota", {"n": 0})
    wait_for(lambda: len(target.received) == 1, message="the first request")
    refused_at = target.received[0].at
    others = [client.start("quota", {"n": n}) for n in range(1, 4)]
    # Another execution waits on the key, and says so.
    waiting = wait_for(
        lambda: client.execution(others[0])["waiting_on_limits"],
        message="the second execution to wait on the held key",
    )
    assert waiting[0]["reason"] == "held" and waiting[0]["key"] == "quota", waiting
    assert "Retry-After 3" in waiting[0]["held_reason"]
    assert step(client.execution(others[0]), "call")["status"] == "ready"
    wait_for(
        lambda: db.execute(COUNT_SUCCEEDED).fetchone()[0] == 4,
        timeout=30,
        message="every execution to succeed",
    )
    later = target.received[1:]
    assert len(later) == 4
    # Nobody sent to the key while it was held (0.2 s for the two clocks' readings).
    assert min(r.at for r in later) >= refused_at + 3 - 0.2, [r.at - refused_at for r in later]
    assert "limit.held" in [e["kind"] for e in client.execution(eid)["events"]]


def test_a_circuit_opens_after_failures_lets_one_probe_through_and_closes(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    healthy = threading.Event()

    def script(request: Received) -> Reply:
        if healthy.is_set():
            return Reply(json={"ok": True}, delay_s=0.5)
        return Reply(status=503, json={"down": True})

    target.script = script
    workers()
    client = Api(api, api_key)
    circuit = {"failures": 3, "window_s": 60, "cool_down_s": 3}
    definition = limited(f"{target.url}/flaky", {"flaky": {"circuit": circuit}}, "flaky")
    definition["steps"][0]["retry"] = {"max_attempts": 1}
    client.publish("flaky", definition)
    for n in range(3):
        client.wait(client.start("flaky", {"n": n}))
    opened_at = target.received[-1].at
    listed = client.session.get(f"{api}/api/v1/circuits", timeout=10).json()["circuits"]
    assert [(c["key"], c["state"]) for c in listed] == [("flaky", "open")]
    healthy.set()
    waiting = [client.start("flaky", {"n": n}) for n in range(3, 6)]
    reason = wait_for(
        lambda: client.execution(waiting[0])["waiting_on_limits"],
        message="a step to wait for the open circuit",
    )
    assert reason[0]["reason"] == "circuit"
    wait_for(
        lambda: db.execute(COUNT_SUCCEEDED).fetchone()[0] == 3,
        timeout=30,
        message="the waiting executions to succeed once the circuit closed",
    )
    later = sorted(r.at for r in target.received[3:])
    assert len(later) == 3
    # Nothing was sent while the circuit was open; then one probe, alone until it was
    # answered (the target answers after 0.5 s); then the others.
    assert later[0] >= opened_at + 3 - 0.2, [t - opened_at for t in later]
    assert later[1] >= later[0] + 0.5 - 0.05, [t - opened_at for t in later]
    assert client.session.get(f"{api}/api/v1/circuits", timeout=10).json()["circuits"] == []


def test_an_operator_closes_a_circuit_by_hand(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    target.script = lambda _r: Reply(status=500)
    workers()
    client = Api(api, api_key)
    circuit = {"failures": 1, "window_s": 60, "cool_down_s": 600}
    definition = limited(f"{target.url}/down", {"down": {"circuit": circuit}}, "down")
    definition["steps"][0]["retry"] = {"max_attempts": 1}
    client.publish("down", definition)
    client.wait(client.start("down", {}))
    target.script = lambda _r: Reply(json={"ok": True})
    eid = client.start("down", {})
    wait_for(lambda: client.execution(eid)["waiting_on_limits"], message="the step to wait")
    closed = client.post("/api/v1/circuits/down/close?workflow=down")
    assert closed.status_code == 200, closed.text
    assert client.wait(eid, timeout=15)["status"] == "succeeded"
    again = client.post("/api/v1/circuits/down/close?workflow=down")
    assert again.status_code == 404 and again.headers["Content-Type"].startswith(
        "application/problem+json"
    )
