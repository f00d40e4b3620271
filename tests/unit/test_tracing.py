"""flowforge/observe/tracing.py with the SDK's in-memory exporter: which spans, with which ids and
parents, and nothing loaded from OpenTelemetry when tracing is off."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from flowforge.domain.engine import Changes, StepState
from flowforge.domain.model import Outcome
from flowforge.observe import tracing
from flowforge.usecases.intake import uuid7
from tests.support.definitions import http, unsigned
from tests.support.processes import ROOT

INCOMING = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = tracing.new_provider("test", {})
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.use(None)


def test_off_by_default_loads_no_opentelemetry_module() -> None:
    """The hot path's cost when off: every hook module imported, configure() run with no
    OTEL_* variable, and not one opentelemetry module in the process."""
    code = (
        "import sys; from flowforge.observe import tracing; "
        "from flowforge.store import runs; from flowforge.usecases import intake; "
        "import flowforge.api.hooks, flowforge.worker.executor, flowforge.worker.main; "
        "assert tracing.configure({}) is False; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_only_named_exporters_turn_tracing_on() -> None:
    assert tracing.wanted({}) == []
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp"}) == ["otlp"]
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp,console"}) == ["otlp", "console"]
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) == []
    with pytest.raises(ValueError, match="zipkin"):
        tracing.wanted({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_the_intake_span_is_a_child_of_the_senders_traceparent(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.intake({"traceparent": INCOMING}, "orders") as span:
        span.accepted("0190-e", replayed=False)
    (written,) = spans.get_finished_spans()
    assert written.kind == SpanKind.SERVER
    assert written.parent is not None and written.parent.span_id == 0xB7AD6B7169203331
    assert written.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert span.traceparent == tracing.format_traceparent(
        written.context.trace_id, written.context.span_id, 1
    )
    assert written.attributes["flowforge.workflow"] == "orders"
    assert written.attributes["http.response.status_code"] == 202


def test_a_refused_webhook_records_its_status(spans: InMemorySpanExporter) -> None:
    class Refused(Exception):
        status = 429

    with pytest.raises(Refused), tracing.intake({}, "orders"):
        raise Refused
    (written,) = spans.get_finished_spans()
    assert written.parent is None  # no traceparent: a new trace
    assert written.attributes["http.response.status_code"] == 429
    assert written.status.status_code != StatusCode.ERROR  # the sender's fault, not ours


def test_a_werkzeug_error_records_its_code(spans: InMemorySpanExporter) -> None:
    from werkzeug.exceptions import RequestEntityTooLarge

    with pytest.raises(RequestEntityTooLarge), tracing.intake({}, "orders"):
        raise RequestEntityTooLarge
    (written,) = spans.get_finished_spans()
    assert written.attributes["http.response.status_code"] == 413


def _step(step_id: str, status: str, started: datetime, took_s: float) -> StepState:
    finished = started + timedelta(seconds=took_s)
    return StepState(step_id, "delay", status, attempts=1, started_at=started, finished_at=finished)


def test_steps_and_the_execution_are_written_whole_under_derived_ids(
    spans: InMemorySpanExporter,
) -> None:
    """Two units of work, as two processes would save them hours apart: each span gets
    the ids every process derives, so the tree holds together without shared memory."""
    eid = str(uuid7())
    intake_tp = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
    started = datetime.now(UTC) - timedelta(hours=3)
    first = Changes(eid, workflow="orders", traceparent=intake_tp)
    first.steps["pause"] = _step("pause", "succeeded", started, 3 * 3600 - 1)
    tracing.saved(first)
    last = Changes(eid, workflow="orders", traceparent=intake_tp)
    last.steps["send"] = _step("send", "failed", started, 3 * 3600)
    last.execution_changed, last.status = True, "failed"
    tracing.saved(last)

    by_name = {s.name: s for s in spans.get_finished_spans()}
    execution = by_name["execution orders"]
    assert {s.context.trace_id for s in by_name.values()} == {0x0AF7651916CD43DD8448EB211C80319C}
    assert execution.parent is not None and execution.parent.span_id == 0x00F067AA0BA902B7
    for name in ("step pause", "step send"):
        assert by_name[name].parent is not None
        assert by_name[name].parent.span_id == execution.context.span_id
    pause = by_name["step pause"]
    assert pause.end_time - pause.start_time == (3 * 3600 - 1) * 1_000_000_000
    assert by_name["step send"].status.status_code == StatusCode.ERROR
    assert execution.attributes["flowforge.execution.status"] == "failed"
    # Derived, so a second process writing the same step gets the same span id.
    again = Changes(eid, workflow="orders", traceparent=intake_tp)
    again.steps["pause"] = _step("pause", "succeeded", started, 1)
    spans.clear()
    tracing.saved(again)
    (rewritten,) = spans.get_finished_spans()
    assert rewritten.context.span_id == pause.context.span_id


def test_an_execution_without_a_webhook_context_roots_a_trace_at_its_id(
    spans: InMemorySpanExporter,
) -> None:
    eid = str(uuid7())
    done = Changes(eid, workflow="nightly", execution_changed=True, status="succeeded")
    tracing.saved(done)
    (execution,) = spans.get_finished_spans()
    assert execution.parent is None
    assert execution.context.trace_id == uuid.UUID(eid).int


def test_the_attempt_span_is_what_the_target_receives(spans: InMemorySpanExporter) -> None:
    from flowforge.domain.definitions import parse_definition
    from flowforge.domain.engine import Run

    definition = parse_definition(unsigned([http("send", "GET", "http://127.0.0.1:9/x")]))
    eid = str(uuid7())
    run = Run(
        execution_id=eid,
        workflow="orders",
        version=1,
        status="running",
        input={},
        definition=definition,
        steps={"send": StepState("send", "http_request", "running", attempts=2)},
        now=datetime.now(UTC),
        traceparent=INCOMING,
    )
    attempt = tracing.attempt(run, "send", 7, "GET", "w-1")
    header = attempt.traceparent()
    attempt.end(Outcome("retry", http_status=503))
    (span,) = spans.get_finished_spans()
    assert header == tracing.format_traceparent(span.context.trace_id, span.context.span_id, 1)
    assert span.kind == SpanKind.CLIENT
    assert span.parent is not None
    assert span.parent.span_id == tracing._Tree(eid, INCOMING).step_span("send")
    assert dict(span.attributes) == {
        "flowforge.execution_id": eid,
        "flowforge.workflow": "orders",
        "flowforge.step": "send",
        "flowforge.attempt": 2,
        "flowforge.fencing_token": 7,
        "flowforge.worker": "w-1",
        "http.request.method": "GET",
        "flowforge.outcome": "retry",
        "http.response.status_code": 503,
    }


def test_bin_api_refuses_an_unknown_exporter_before_serving(tmp_path: Any) -> None:
    """A typo stops the server with what is wrong, instead of each gunicorn worker."""
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "jaeger", "FLOWFORGE_DATABASE_URL": "x"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "bin" / "api"), "--bind", "127.0.0.1:0"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert "OTEL_TRACES_EXPORTER: jaeger not supported" in out.stderr
