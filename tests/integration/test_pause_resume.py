"""docs/contract.md#pause through real bin/api and bin/worker processes: pausing and resuming a
workflow under a concurrency limit (webhooks still accepted and queued, max_queued and
start_within_s still applied, release in arrival order), pausing one execution, and
retry.on_exhausted "pause" — resumed (the step runs again) or failed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.support.api import Api, step
from tests.support.definitions import unsigned
from tests.support.inprocess import InProcess
from tests.support.processes import Process, wait_for
from tests.support.target import Received, Reply, Target


def flow(steps: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    return unsigned(steps, "flow", **options)


def call(step_id: str, url: str, method: str = "POST", **extra: Any) -> dict[str, Any]:
    return {
        "id": step_id,
        "type": "http_request",
        "request": {"method": method, "url": url, "json": {"n": "{{ input.n }}"}},
        **extra,
    }


def events(execution: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in execution["events"] if e["kind"] == kind]


def recorded(client: Api, eid: str) -> dict[str, Any] | None:
    """The execution once its first step is no longer running."""
    execution = client.execution(eid)
    return execution if step(execution, "first")["status"] != "running" else None


@pytest.fixture
def client(api: str, api_key: str) -> Api:
    return Api(api, api_key)


class Held:
    """Holds each request to /first until released, counting those in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.release = threading.Event()

    def __call__(self, received: Received) -> Reply:
        if received.path.endswith("/first"):
            with self.lock:
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
            self.release.wait(30)
            with self.lock:
                self.in_flight -= 1
        return Reply(json={"ok": True})


def test_a_paused_workflow_accepts_and_queues_starts_nothing_and_resumes_in_arrival_order(
    client: Api, target: Target, workers: Callable[..., Process], db: psycopg.Connection
) -> None:
    held = Held()
    target.script = held
    client.publish(
        "paused",
        flow(
            [
                call("first", f"{target.url}/first"),
                call("second", f"{target.url}/second", depends_on=["first"]),
            ],
            concurrency={"limit": 2, "max_queued": 6},
        ),
    )
    workers()
    early = [client.start("paused", {"n": n}) for n in range(4)]
    wait_for(lambda: held.in_flight == 2, timeout=20, message="two requests in flight")

    paused = client.post("/api/v1/workflows/paused/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True and paused.json()["held"] == 2
    # Accepted while paused: 202, queued behind the two that wait for a slot.
    late = [client.start("paused", {"n": n}) for n in range(4, 8)]
    # max_queued (6) still applies: 2 + 4 are queued, the next one is refused.
    full = client.hook("paused", {"n": 99})
    assert full.status_code == 429, full.text
    # The requests in flight finish and are recorded; nothing else starts.
    held.release.set()
    for eid in early[:2]:
        execution = wait_for(lambda eid=eid: recorded(client, eid), message="request recorded")
        assert execution["status"] == "paused"
        assert step(execution, "first")["status"] == "succeeded"
        assert step(execution, "second")["status"] == "pending"
        paused_event = events(execution, "execution.paused")[0]["detail"]
        assert paused_event["reason"] == "workflow"
        assert paused_event["actor"]["kind"] == "api_key"
    time.sleep(3)  # several timer, reconciler and reaper passes
    assert [r.path for r in target.received].count("/second") == 0
    assert len(target.received) == 2
    why = client.execution(late[-1])
    assert why["status"] == "queued"
    assert why["flow_control"]["workflow_paused"]["by"]["kind"] == "api_key"
    assert why["flow_control"]["waiting_for_slot"]["ahead"] == 5
    shown = client.session.get(f"{client.base}/api/v1/workflows/paused", timeout=10).json()
    assert shown["paused"]["by"]["kind"] == "api_key"

    resumed = client.post("/api/v1/workflows/paused/resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["resumed"] == 2
    ids = early + late
    for eid in ids:
        execution = client.wait(eid, timeout=40)
        assert execution["status"] == "succeeded", execution["status"]
    assert held.peak <= 2
    assert (
        events(client.execution(early[0]), "execution.resumed")[0]["detail"]["actor"]["kind"]
        == "api_key"
    )
    # Released through flow control in arrival order: slots were handed oldest first.
    # (event ids are taken under the key's slot lock, so they are in grant order)
    granted = db.execute(
        "SELECT execution_id::text FROM execution_events WHERE kind = 'execution.slot_granted'"
        " ORDER BY id"
    ).fetchall()
    assert [r[0] for r in granted] == ids


def test_paused_while_queued_still_expires_by_start_within_s(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    client.publish("expiring", flow([call("first", f"{target.url}/first")], start_within_s=2))
    assert client.post("/api/v1/workflows/expiring/pause").status_code == 200
    workers()
    eid = client.start("expiring", {"n": 1})
    # The first worker to take it up pauses it (it was queued), then expiry ends it.
    execution = client.wait(eid, "cancelled", timeout=20)
    assert execution["flow_control"]["stop_reason"] == "expired"
    assert events(execution, "execution.paused")[0]["detail"]["from"] == "queued"
    assert target.received == []


def test_one_execution_pauses_in_a_delay_and_resumes_with_the_actor_in_history(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    client.publish(
        "napping",
        flow(
            [
                {"id": "nap", "type": "delay", "duration_s": 1},
                call("first", f"{target.url}/first", depends_on=["nap"]),
            ]
        ),
    )
    workers()
    eid = client.start("napping", {"n": 1})
    client.wait(eid, "waiting")
    paused = client.post(f"/api/v1/executions/{eid}/pause")
    assert paused.status_code == 200 and paused.json()["status"] == "paused", paused.text
    time.sleep(3)  # the delay is long due; the timer makes it ready, nothing runs it
    execution = client.execution(eid)
    assert execution["status"] == "paused"
    assert execution["flow_control"]["paused"] == {"reason": "operator", "was": "waiting"}
    assert target.received == []
    # Resuming a running execution, or pausing a finished one, is refused with a problem.
    resumed = client.post(f"/api/v1/executions/{eid}/resume")
    assert resumed.status_code == 200, resumed.text
    execution = client.wait(eid)
    assert execution["status"] == "succeeded"
    assert len(target.received) == 1
    assert events(execution, "execution.paused")[0]["detail"]["actor"]["kind"] == "api_key"
    assert events(execution, "execution.resumed")[0]["detail"]["actor"]["kind"] == "api_key"
    again = client.post(f"/api/v1/executions/{eid}/pause")
    assert again.status_code == 409
    assert again.headers["Content-Type"] == "application/problem+json"
    assert client.post(f"/api/v1/executions/{eid}/resume").status_code == 409


def test_on_exhausted_pause_holds_the_execution_then_resume_runs_the_step_again_or_fail(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    answers = {"status": 503}
    target.script = lambda _r: Reply(status=answers["status"], json={"down": True})
    retry = {"max_attempts": 2, "initial_interval_s": 0.1, "on_exhausted": "pause"}
    client.publish(
        "patient",
        flow(
            [
                # A PUT is safe to repeat: a 503 is tried again.
                call("first", f"{target.url}/first", "PUT", retry=retry),
                call("second", f"{target.url}/second", depends_on=["first"]),
            ]
        ),
    )
    workers()
    fixed, given_up = client.start("patient", {"n": 1}), client.start("patient", {"n": 2})
    for eid in (fixed, given_up):
        execution = client.wait(eid, "paused")
        assert step(execution, "first")["status"] == "failed"
        assert step(execution, "second")["status"] == "pending"
        detail = events(execution, "execution.paused")[0]["detail"]
        assert detail["reason"] == "exhausted" and detail["step"] == "first"
    assert len(target.received) == 4
    time.sleep(2)
    assert len(target.received) == 4  # nothing more while paused

    answers["status"] = 200  # the partner is fixed
    assert client.post(f"/api/v1/executions/{fixed}/resume").status_code == 200
    execution = client.wait(fixed)
    assert execution["status"] == "succeeded"
    assert len(step(execution, "first")["attempts"]) == 3

    failed = client.post(f"/api/v1/executions/{given_up}/fail")
    assert failed.status_code == 200, failed.text
    execution = client.wait(given_up)
    assert execution["status"] == "failed"
    assert step(execution, "second")["status"] == "cancelled"
    assert events(execution, "execution.fail_requested")[0]["detail"]["actor"]["kind"] == (
        "api_key"
    )
    assert [r.path for r in target.received].count("/second") == 1


def test_an_execution_paused_with_a_step_ready_resumes_and_runs_it(
    in_process: InProcess, target: Target
) -> None:
    """Soak seed 2301: an execution paused while its first step was `ready` (accepted,
    no worker had taken it yet) answered 500 to its resume — the resume dispatched that
    step again though the unit of work had not changed it (KeyError in save_run) — and
    stayed paused for good; the workflow's resume failed the same way. In the test's
    process, nothing takes a step until `wait` runs it."""
    client = in_process
    client.publish("ready", flow([call("first", f"{target.url}/first")]))
    eid = client.start("ready", {"n": 1})
    assert step(client.execution(eid), "first")["status"] == "ready"
    assert client.post(f"/api/v1/executions/{eid}/pause").status_code == 200
    resumed = client.post(f"/api/v1/executions/{eid}/resume")
    assert resumed.status_code == 200, resumed.text
    other = client.start("ready", {"n": 2})
    assert client.post("/api/v1/workflows/ready/pause").status_code == 200
    assert client.execution(other)["status"] == "paused"
    assert client.post("/api/v1/workflows/ready/resume").status_code == 200, "workflow resume"
    assert client.wait(eid)["status"] == "succeeded"
    assert client.wait(other)["status"] == "succeeded"
    assert len(target.received) == 2
