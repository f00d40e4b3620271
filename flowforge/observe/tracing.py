"""OpenTelemetry traces of the intake, each execution, step and attempt (see
docs/reference/tracing.md).

Off unless OTEL_TRACES_EXPORTER names an exporter (`otlp` or `console`), and then the
SDK and the OTLP/HTTP exporter come from the optional extra `flowforge[otel]`. Off, this
module imports nothing from OpenTelemetry and each hook is one `is None` test, so a
deployment without tracing pays nothing for it (tests/unit/test_tracing.py checks that
no `opentelemetry` module is loaded, the bench measures the cost when on).

One execution lives for seconds or for days, across API and worker processes and their
crashes, so no process can hold its span open. Instead each span is written when the
work it describes ends, with the start time PostgreSQL recorded, and every id in the tree
is derived from FlowForge's own ids: the trace is the webhook's (its `traceparent` is
stored on the execution, migration 0023) or, without one, the execution id itself; the
execution's span id comes from the execution id, a step's from the execution and step
ids. Whichever process ends a step or an execution — the worker that ran it, another
after a SIGKILL, the API that took a resume — writes the same span into the same trace.
Attempts are the only spans held open while they run: one http_request send, whose
context the target receives as `traceparent`.

No attribute holds a body, a header value, a URL or an error message (any may quote a
secret or personal data): ids, types, statuses, counts and HTTP status codes only.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib.util
import os
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from flowforge.domain.engine import Changes, Run
    from flowforge.domain.model import Outcome

EXPORTERS = frozenset({"otlp", "console"})
SCOPE = "flowforge"

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
# The (trace id, span id) the next span must get: set around a span whose ids are derived.
_preset: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "flowforge_trace_ids", default=None
)


def wanted(env: Mapping[str, str]) -> list[str]:
    """The exporters OTEL_TRACES_EXPORTER asks for; none (tracing off) unless it is set.

    The OpenTelemetry default is `otlp`; FlowForge's is `none`, so that installing the
    extra never starts sending spans nobody configured a collector for."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "none").split(",")]
    unknown = [n for n in names if n and n != "none" and n not in EXPORTERS]
    if unknown:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER: {', '.join(unknown)} not supported (otlp, console, none)"
        )
    return [n for n in names if n in EXPORTERS]


def check(env: Mapping[str, str]) -> None:
    """Raise ValueError, with what to do, when OTEL_* asks for what cannot be had: bin/api
    calls it before gunicorn starts, so a typo stops the server instead of each worker."""
    if wanted(env) and importlib.util.find_spec("opentelemetry.sdk") is None:
        raise ValueError(
            "OTEL_TRACES_EXPORTER is set but the OpenTelemetry SDK is not installed: "
            "pip install 'flowforge[otel]'"
        )


def configure(env: Mapping[str, str] = os.environ, *, service: str = "flowforge") -> bool:
    """Start tracing in this process if OTEL_TRACES_EXPORTER asks for it; True if on.

    Called once by each process (every gunicorn worker after its fork, since the batch
    exporter's thread does not survive one; bin/worker at start). Everything else is the
    SDK's standard configuration: OTEL_SERVICE_NAME (default `service`),
    OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_EXPORTER_OTLP_ENDPOINT and the
    other OTEL_EXPORTER_OTLP_* variables, OTEL_BSP_* for batching."""
    exporters = wanted(env)
    if not exporters:
        return False
    check(env)
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = new_provider(service, env)
    for name in exporters:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    use(provider)
    return True


def new_provider(service: str = "flowforge", env: Mapping[str, str] = os.environ) -> TracerProvider:
    """A tracer provider that can give a span the ids FlowForge derives (tests add their
    own span processor, such as the SDK's in-memory exporter)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class DerivedIds(RandomIdGenerator):
        """Random ids, except for a span FlowForge names the ids of."""

        def generate_span_id(self) -> int:
            preset = _preset.get()
            return preset[1] if preset else super().generate_span_id()

        def generate_trace_id(self) -> int:
            preset = _preset.get()
            return preset[0] if preset else super().generate_trace_id()

    named = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": service}
    return TracerProvider(resource=Resource.create(named), id_generator=DerivedIds())


def use(provider: TracerProvider | None) -> None:
    """Send this process's spans to `provider` (None: tracing off)."""
    global _tracer, _provider
    _provider = provider
    _tracer = provider.get_tracer(SCOPE) if provider is not None else None


def active() -> bool:
    """Whether this process traces (the hooks test it before doing any work)."""
    return _tracer is not None


def shutdown() -> None:
    """Export what is buffered and stop (a draining worker's last step)."""
    if _provider is not None:
        _provider.shutdown()
    use(None)


# ---- ids and contexts ----------------------------------------------------------------------


def _derived(*parts: str) -> int:
    digest = hashlib.blake2b(":".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def _parse(traceparent: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a W3C traceparent, or None."""
    if not traceparent:
        return None
    try:
        version, trace_id, span_id, flags = traceparent.split("-")
        parsed = int(trace_id, 16), int(span_id, 16), int(flags, 16)
    except ValueError:
        return None
    if version != "00" or len(trace_id) != 32 or len(span_id) != 16 or not all(parsed[:2]):
        return None
    return parsed


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    """The W3C traceparent header of a span context."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


class _Tree:
    """The derived ids of one execution's spans."""

    def __init__(self, execution_id: str, traceparent: str | None) -> None:
        self.execution_id = execution_id
        stored = _parse(traceparent)
        if stored is None:
            # No webhook context (a schedule tick, tracing off at intake): the execution
            # roots its own trace, whose id is the execution id.
            self.trace_id, self.intake_span, self.flags = uuid.UUID(execution_id).int, None, 1
        else:
            self.trace_id, self.intake_span, self.flags = stored
        self.execution_span = _derived("execution", execution_id)

    def step_span(self, step_id: str) -> int:
        return _derived("step", self.execution_id, step_id)

    def under(self, span_id: int | None) -> Context:
        """A context whose current span is `span_id` of this trace (None: a root)."""
        from opentelemetry import trace
        from opentelemetry.context import Context

        if span_id is None:
            return Context()
        parent = trace.SpanContext(
            self.trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(self.flags)
        )
        return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


def _write(
    tree: _Tree,
    name: str,
    span_id: int,
    parent: int | None,
    start: datetime,
    end: datetime | None,
    attributes: dict[str, Any],
    failed: bool,
) -> None:
    """A span with derived ids, written whole: its work ended at `end`."""
    from opentelemetry.trace import Status, StatusCode

    assert _tracer is not None
    token = _preset.set((tree.trace_id, span_id))
    try:
        span = _tracer.start_span(
            name, context=tree.under(parent), attributes=attributes, start_time=_ns(start)
        )
    finally:
        _preset.reset(token)
    if failed:
        span.set_status(Status(StatusCode.ERROR))
    span.end(end_time=_ns(end) if end is not None else None)


# ---- the hooks ------------------------------------------------------------------------------
STEP_ENDS = frozenset({"succeeded", "failed", "skipped", "cancelled"})
EXECUTION_ENDS = frozenset({"succeeded", "failed", "cancelled"})


def saved(changes: Changes) -> None:
    """Write the spans of the steps and the execution this committed unit of work ended
    (runs.save_run hands it over after the COMMIT)."""
    if _tracer is None:
        return
    tree = _Tree(changes.execution_id, changes.traceparent)
    ids = {"flowforge.execution_id": changes.execution_id, "flowforge.workflow": changes.workflow}
    for state in changes.steps.values():
        if state.status not in STEP_ENDS or state.started_at is None:
            continue
        _write(
            tree,
            f"step {state.step_id}",
            tree.step_span(state.step_id),
            tree.execution_span,
            state.started_at,
            state.finished_at,
            {
                **ids,
                "flowforge.step": state.step_id,
                "flowforge.step.type": state.type,
                "flowforge.step.status": state.status,
                "flowforge.step.attempts": state.attempts,
            },
            state.status == "failed",
        )
    if changes.execution_changed and changes.status in EXECUTION_ENDS:
        # The intake made it: the millisecond clock of its UUIDv7 id (intake.uuid7).
        accepted = uuid.UUID(changes.execution_id)
        start = datetime.fromtimestamp((accepted.int >> 80) / 1000.0).astimezone()
        _write(
            tree,
            f"execution {changes.workflow}",
            tree.execution_span,
            tree.intake_span,
            start,
            None,
            {**ids, "flowforge.execution.status": changes.status},
            changes.status != "succeeded",
        )


class Attempt:
    """The span of one http_request attempt, open while the request is out."""

    def __init__(self, span: Span | None) -> None:
        self.span = span

    def traceparent(self) -> str | None:
        """The header the target receives: this attempt's span as its parent."""
        if self.span is None:
            return None
        ctx = self.span.get_span_context()
        return format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags))

    def end(self, outcome: Outcome) -> None:
        """Close the span with how the attempt ended."""
        if self.span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("flowforge.outcome", outcome.kind)
        if outcome.http_status is not None:
            self.span.set_attribute("http.response.status_code", outcome.http_status)
        if outcome.kind != "succeeded":
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()


NO_ATTEMPT = Attempt(None)


def attempt(run: Run, step_id: str, token: int, method: str, worker: str) -> Attempt:
    """Open the span of the attempt about to be sent (a CLIENT span under its step's)."""
    if _tracer is None:
        return NO_ATTEMPT
    from opentelemetry.trace import SpanKind

    tree = _Tree(run.execution_id, run.traceparent)
    state = run.steps[step_id]
    span = _tracer.start_span(
        f"attempt {step_id}",
        context=tree.under(tree.step_span(step_id)),
        kind=SpanKind.CLIENT,
        attributes={
            "flowforge.execution_id": run.execution_id,
            "flowforge.workflow": run.workflow,
            "flowforge.step": step_id,
            "flowforge.attempt": state.attempts,
            "flowforge.fencing_token": token,
            "flowforge.worker": worker,
            "http.request.method": method,
        },
    )
    return Attempt(span)


class Intake:
    """The SERVER span of one webhook, a child of the sender's `traceparent` if any."""

    def __init__(self, span: Span | None) -> None:
        self.span = span

    @property
    def traceparent(self) -> str | None:
        """What the execution stores: the intake span, parent of the execution's."""
        if self.span is None:
            return None
        ctx = self.span.get_span_context()
        return format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags))

    def __enter__(self) -> Intake:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _tb: Any
    ) -> None:
        if self.span is None:
            return
        if exc is not None:
            from opentelemetry.trace import Status, StatusCode

            # A Problem or ClientError has `status`, a werkzeug HTTPException `code`.
            status = getattr(exc, "status", None) or getattr(exc, "code", None)
            code = status if isinstance(status, int) else 500
            self.span.set_attribute("http.response.status_code", code)
            if code >= 500:
                self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()

    def accepted(self, execution_id: str, replayed: bool) -> None:
        """The answer was 202: which execution it made (or replayed)."""
        if self.span is not None:
            self.span.set_attribute("flowforge.execution_id", execution_id)
            self.span.set_attribute("flowforge.replayed", replayed)
            self.span.set_attribute("http.response.status_code", 202)


NO_INTAKE = Intake(None)


def _operator_samples(trace_id: int, name: str) -> int:
    """1 if the configured sampler samples a trace with this id as if it were a root
    (OTEL_TRACES_SAMPLER; a parent-based one's root sampler), else 0: the same answer
    for the same trace id, whoever sends it and whatever flag it sends."""
    assert _provider is not None
    sampler = _provider.sampler
    # ParentBased keeps the sampler it uses for roots as `_root` (OpenTelemetry SDK).
    root = getattr(sampler, "_root", sampler)
    return 1 if root.should_sample(None, trace_id, name).decision.is_sampled() else 0


def intake(headers: Any, workflow: str) -> Intake:
    """Open the span of a webhook to `workflow`; `headers` are the request's (a mapping
    with `get`, such as Flask's)."""
    if _tracer is None:
        return NO_INTAKE
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    # The W3C propagator only (the SDK's default): traceparent and tracestate.
    carrier = {k: v for k in ("traceparent", "tracestate") if (v := headers.get(k))}
    parsed = _parse(carrier.get("traceparent"))
    if parsed is not None:
        # The sender's trace id and parent span are kept; its sampled flag is not obeyed
        # (a flood could force sampling on): the operator's sampler decides it.
        trace_id, span_id, flags = parsed
        sampled = _operator_samples(trace_id, "POST /hooks/{key}")
        carrier["traceparent"] = format_traceparent(trace_id, span_id, flags & ~1 | sampled)
    span = _tracer.start_span(
        "POST /hooks/{key}",
        context=extract(carrier),
        kind=SpanKind.SERVER,
        attributes={
            "flowforge.workflow": workflow,
            "http.request.method": "POST",
            "http.route": "/hooks/{key}",
        },
    )
    return Intake(span)
