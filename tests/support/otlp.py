"""An OTLP/HTTP trace collector on 127.0.0.1, for the tracing tests and the tracing bench:
what bin/api and bin/worker export with OTEL_EXPORTER_OTLP_ENDPOINT pointed at it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.support.target import Served


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent: str
    name: str
    service: str
    attributes: dict[str, Any]


class Collector(Served):
    """An OTLP/HTTP receiver: POST /v1/traces with an ExportTraceServiceRequest; keeps
    every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with collector.lock:
                    collector.spans.extend(_spans(request))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(ThreadingHTTPServer(("127.0.0.1", 0), Handler))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def count(self) -> int:
        """How many spans have arrived so far."""
        with self.lock:
            return len(self.spans)

    def named(self, prefix: str) -> list[Span]:
        """The spans whose name starts with `prefix`."""
        with self.lock:
            return [s for s in self.spans if s.name.startswith(prefix)]


def _value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


def _spans(request: ExportTraceServiceRequest) -> Iterator[Span]:
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            for span in scope.spans:
                yield Span(
                    span.trace_id.hex(),
                    span.span_id.hex(),
                    span.parent_span_id.hex(),
                    span.name,
                    resource["service.name"],
                    {a.key: _value(a.value) for a in span.attributes},
                )
