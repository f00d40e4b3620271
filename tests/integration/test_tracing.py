"""Traces from real bin/api and bin/worker processes, received by the tests' OTLP/HTTP
collector (127.0.0.1, tests/support/otlp.py): one trace from the partner's traceparent to
the one the target receives, across a delay and a worker SIGKILL."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support.api import Api, step
from tests.support.definitions import delay, http, workflow
from tests.support.otlp import Collector
from tests.support.processes import start_api, wait_for
from tests.support.target import Reply, Target

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
INCOMING = f"00-{TRACE}-{PARENT}-01"
SECRET = "tok-s3cr3t-value"


@pytest.fixture
def collector() -> Iterator[Collector]:
    with contextlib.closing(Collector()) as server:
        yield server


@pytest.fixture
def traced(env: dict[str, str], collector: Collector) -> dict[str, str]:
    """The processes' environment with traces exported to the collector, quickly."""
    return {
        **env,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


WORKER_ENV = {
    "FLOWFORGE_SECRET_API_TOKEN": SECRET,
    "FLOWFORGE_SECRET_API_TOKEN_WORKFLOWS": "traced",
}


def test_one_trace_from_the_partner_to_the_target_across_a_delay_and_a_sigkill(
    traced: dict[str, str],
    tmp_path: Any,
    workers: Any,
    target: Target,
    collector: Collector,
    api_key: str,
    db: psycopg.Connection,
) -> None:
    api_proc, base = start_api(traced, tmp_path / "api.log")
    try:
        client = Api(base, api_key)
        client.publish(
            "traced",
            workflow(
                delay("pause", 1),
                http(
                    "fetch",
                    "GET",
                    f"{target.url}/orders",
                    after=("pause",),
                    headers={"Authorization": "Bearer {{ secrets.api_token }}"},
                ),
            ),
        )
        calls: list[int] = []

        def answer(_r: Any) -> Reply:
            calls.append(1)
            # The first attempt is held until its worker is killed.
            return Reply(json={"ok": True}, delay_s=8.0 if len(calls) == 1 else 0.0)

        target.script = answer
        otel = {k: v for k, v in traced.items() if k.startswith("OTEL_")}
        doomed = workers(**otel, **WORKER_ENV)
        eid = client.start("traced", {"order": 1}, headers={"traceparent": INCOMING})
        wait_for(lambda: target.requests_to("/orders"), timeout=30, message="the first GET")
        # The pause step's span leaves in the doomed worker's next batch (100 ms): a
        # SIGKILL before it would lose it with the process, which no exporter survives.
        wait_for(lambda: collector.named("step pause"), timeout=5, message="the pause span")
        doomed.kill()
        workers(**otel, **WORKER_ENV)
        done = client.wait(eid, timeout=60)
        assert done["status"] == "succeeded", done
        fetch = step(done, "fetch")
        assert len(fetch["attempts"]) == 2

        received = [r.headers["traceparent"] for r in target.requests_to("/orders")]
        assert len(received) == 2
        assert all(tp.startswith(f"00-{TRACE}-") and tp.endswith("-01") for tp in received)
        assert all(r.headers["authorization"] == f"Bearer {SECRET}" for r in target.received)
        # The recorded request is what the definition sent, the secret redacted.
        (recorded,) = db.execute(
            "SELECT request FROM attempts WHERE execution_id = %s ORDER BY attempt LIMIT 1",
            (eid,),
        ).fetchone()
        assert SECRET not in str(recorded)
        assert "traceparent" not in {k.lower() for k in recorded["headers"]}

        # Each process exports in its own batches: wait for every span, not the first.
        wait_for(
            lambda: (
                collector.named("execution")
                and len(collector.named("step")) >= 2
                and collector.named("attempt")
            ),
            timeout=20,
            message="the execution, step and attempt spans",
        )
        (intake,) = collector.named("POST /hooks")
        (execution,) = collector.named("execution")
        steps = {s.name: s for s in collector.named("step")}
        attempts = collector.named("attempt")
    finally:
        api_proc.stop()

    assert intake.parent == PARENT and intake.service == "flowforge-api"
    assert intake.attributes["flowforge.execution_id"] == eid
    assert execution.parent == intake.span_id
    assert set(steps) == {"step pause", "step fetch"}
    assert all(s.parent == execution.span_id for s in steps.values())
    # The killed worker never ended its attempt: only the successor's was exported, and it
    # is the parent the target received the second time.
    (attempt,) = attempts
    assert attempt.parent == steps["step fetch"].span_id
    assert attempt.service == "flowforge-worker"
    assert received[1] == f"00-{TRACE}-{attempt.span_id}-01"
    assert received[0] != received[1]
    every = [intake, execution, *steps.values(), attempt]
    assert {s.trace_id for s in every} == {TRACE}
    for span in every:
        assert SECRET not in repr(span.attributes)
        assert '"order"' not in repr(span.attributes)
