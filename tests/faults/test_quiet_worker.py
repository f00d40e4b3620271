"""A quiet worker keeps its connections healthy.

Promise: a worker that has nothing to do for longer than the broker's heartbeat timeout
still answers the broker's heartbeats on every connection — the relay's too, although it
spends its idle time waiting on PostgreSQL's LISTEN — so the next webhook's wake-up is
published at once, with no dropped connection and nothing about it in the log. The step
is an http_request: a lone pure step the relay would run itself, without publishing.
"""

from __future__ import annotations

import time

from tests.faults.helpers import StartWorker, log_records
from tests.support.api import Api
from tests.support.definitions import http, workflow
from tests.support.target import Target

HEARTBEAT_S = 2
# RabbitMQ closes a connection two to three timeouts after the last frame it received.
QUIET_S = 4 * HEARTBEAT_S


def test_a_worker_idle_past_the_heartbeat_timeout_publishes_the_next_wakeup_cleanly(
    client: Api, workers: StartWorker, amqp_url: str, target: Target
) -> None:
    client.publish("echo", workflow(http("copy", "GET", f"{target.url}/copy")))
    separator = "&" if "?" in amqp_url else "?"
    worker = workers(FLOWFORGE_AMQP_URL=f"{amqp_url}{separator}heartbeat={HEARTBEAT_S}")
    first = client.start("echo", {"n": 1})
    assert client.wait(first, timeout=20)["status"] == "succeeded"

    time.sleep(QUIET_S)
    second = client.start("echo", {"n": 2})
    assert client.wait(second, timeout=20)["status"] == "succeeded"

    noisy = [r for r in log_records(worker) if r.get("level") in {"warning", "error"}]
    assert noisy == []
    assert "Traceback" not in worker.log()
