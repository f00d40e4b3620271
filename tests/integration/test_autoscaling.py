"""The autoscaling signal (flowforge_work_depth, docs/howto/autoscaling.md) from a real
bin/api, and a scale-in as an orchestrator does it: SIGTERM to the worker running the work
while another worker is up. The drained worker finishes its steps under leases it keeps
renewing (each step outlasts a lease), so none is taken over or sent twice."""

from __future__ import annotations

import signal
from collections.abc import Callable

from tests.faults.helpers import wait_logged
from tests.integration.test_metrics import scrape
from tests.support.api import Api, step
from tests.support.definitions import http, workflow
from tests.support.processes import Process, wait_for
from tests.support.target import Reply, Target

# Longer than the tests' 2 s lease: only a renewed lease keeps the successor out.
STEP_S = 5.0


def depth(api: str) -> dict[tuple[str, str], float]:
    """flowforge_work_depth by (workflow, state), as the API serves it."""
    return {
        (dict(labels)["workflow"], dict(labels)["state"]): count
        for (name, labels), count in scrape(f"{api}/metrics").items()
        if name == "flowforge_work_depth"
    }


def test_work_depth_by_workflow_and_a_scaled_in_worker_drains_without_losing_a_lease(
    api: str, api_key: str, workers: Callable[..., Process], target: Target
) -> None:
    client = Api(api, api_key)
    for name in ("orders", "refunds"):
        client.publish(name, workflow(http("call", "POST", f"{target.url}/{name}", json="{}")))
    target.script = lambda _r: Reply(json={"ok": True}, delay_s=STEP_S)
    assert depth(api) == {}

    # No worker yet: everything accepted is ready work.
    started = [client.start("orders", {}) for _ in range(3)] + [client.start("refunds", {})]
    assert depth(api) == {("orders", "ready"): 3, ("refunds", "ready"): 1}

    busy = workers(FLOWFORGE_WORKER_ID="busy")  # four executor threads: all four steps start
    wait_for(lambda: len(target.received) == 4, timeout=30, message="all four steps to start")
    wait_for(
        lambda: depth(api) == {("orders", "running"): 3, ("refunds", "running"): 1},
        message="the gauge to count the running steps",
    )

    # Scale in: a second worker is up, the busy one is told to stop.
    successor = workers(FLOWFORGE_WORKER_ID="successor")
    busy.signal(signal.SIGTERM)
    wait_logged(busy, "draining")
    assert busy.popen.wait(timeout=30) == 0
    for eid in started:
        done = client.wait(eid, timeout=30)
        assert done["status"] == "succeeded", done
        call = step(done, "call")
        # One attempt, by the drained worker: no takeover, nothing sent twice.
        assert [(a["worker"], a["outcome"]) for a in call["attempts"]] == [("busy", "succeeded")]
    assert len(target.received) == 4
    assert "lost ownership" not in busy.log() + successor.log()
    assert depth(api) == {}
