"""A recording HTTP target on 127.0.0.1 whose answers each test scripts."""

from __future__ import annotations

import contextlib
import json
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextlib.contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[None]:
    """`server` answers from a thread of its own for the block; then it is shut and closed."""
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def most_in_any_second(times: list[float]) -> int:
    """The most arrivals in any window of one second (sliding, not calendar seconds)."""
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


@dataclass
class Received:
    """One request the target saw."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() once its request line and headers had arrived

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    """What to answer: status, JSON or raw body, headers, and an optional delay."""

    status: int = 200
    json: Any = None
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


Script = Callable[[Received], Reply]


class _Server(ThreadingHTTPServer):
    # socketserver's listen backlog is 5: a worker opening hundreds of connections at
    # once (the outbound bench) would wait out SYN retransmits.
    request_queue_size = 1024


class Served:
    """A server answering from a daemon thread of its own until `close()`: the recording
    target here and the tests' other fake peers (the OTLP collector)."""

    def __init__(self, server: socketserver.BaseServer) -> None:
        self.server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Target(Served):
    """Records every request; `script` decides the reply (default: 200 with {"ok": true}).
    With `tls` it serves https; `connections` counts the TCP connections it accepted."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.received: list[Received] = []
        self.connections = 0
        self.script: Script = lambda _r: Reply(json={"ok": True})
        self._lock = threading.Lock()
        target = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                with target._lock:
                    target.connections += 1
                super().setup()

            def _serve(self) -> None:
                arrived = time.time()  # request line and headers are in; the body may not be
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                seen = Received(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    arrived,
                )
                with target._lock:
                    target.received.append(seen)
                reply = target.script(seen)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                payload = json.dumps(reply.json).encode() if reply.json is not None else reply.body
                try:
                    if "Date" in reply.headers:  # a target's clock of its own
                        self.log_request(reply.status)
                        self.send_response_only(reply.status)
                        self.send_header("Server", self.version_string())
                    else:
                        self.send_response(reply.status)
                    if reply.json is not None:
                        self.send_header("Content-Type", "application/json")
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        super().__init__(self.server)

    def requests_to(self, path: str) -> list[Received]:
        """Requests whose path starts with `path`."""
        with self._lock:
            return [r for r in self.received if r.path.startswith(path)]


class InFlight:
    """A script that holds each request `hold_s` and counts how many it holds at once
    (`now`, `most`): how a test sees the worker's outbound concurrency. `answer` gives the
    reply once the hold is over (default: 200 with {"ok": true})."""

    def __init__(self, hold_s: float, answer: Script | None = None) -> None:
        self.hold_s = hold_s
        self.answer: Script = answer or (lambda _r: Reply(json={"ok": True}))
        self.now = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, request: Received) -> Reply:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.hold_s)
        with self._lock:
            self.now -= 1
        return self.answer(request)


def first_then_ok(first: Reply) -> Script:
    """A script that answers `first` to the first request and 200 {"ok": true} to every
    later one: a throttle or an outage the worker has to ride out once."""
    answered = threading.Event()

    def script(_request: Received) -> Reply:
        if answered.is_set():
            return Reply(json={"ok": True})
        answered.set()
        return first

    return script
