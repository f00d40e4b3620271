"""The full send path, against servers on 127.0.0.1 only.

Refusal cases use loopback addresses that are NOT allowed (127.0.0.2, ::1, mapped forms), so
even a broken guard could only ever reach this machine. Other names go through a fake resolver.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import re
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import pytest

from flowforge.steps.netguard import (
    Allowlist,
    HttpResult,
    NotSent,
    RequestInvalid,
    RequestRefused,
    SentNoResponse,
    send,
)
from tests.support.services import unavailable
from tests.support.target import serving

LOOPBACK = Allowlist.parse("127.0.0.1")
NOTHING = Allowlist.parse("")


@dataclass
class Seen:
    """One request as the test server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    port: int
    seen: list[Seen] = field(default_factory=list)
    sni: list[str | None] = field(default_factory=list)

    def url(self, path: str = "/echo", host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"


class Handler(BaseHTTPRequestHandler):
    """Routes: /echo, /bytes?n=, /redirect, /target, /retry-after?value=."""

    seen: list[Seen]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        url = urlsplit(self.path)
        query = {key: values[0] for key, values in parse_qs(url.query).items()}
        self.seen.append(Seen(self.command, self.path, dict(self.headers.items()), body))
        if url.path == "/bytes":
            self.reply(200, b"x" * int(query["n"]))
        elif url.path == "/redirect":
            self.reply(302, b"", {"Location": "/target"})
        elif url.path == "/retry-after":
            self.reply(429, b"", {"Retry-After": query["value"]} if "value" in query else {})
        else:
            echo = {"method": self.command, "host": self.headers["Host"], "body": body.decode()}
            self.reply(200, json.dumps(echo).encode(), {"Content-Type": "application/json"})

    do_POST = do_PUT = do_HEAD = do_GET

    def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"X-Test": "yes", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


@contextlib.contextmanager
def http_server(context: ssl.SSLContext | None = None) -> Iterator[Server]:
    """A recording server on 127.0.0.1 and an ephemeral port, optionally speaking TLS."""
    handler = type("RecordingHandler", (Handler,), {"seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server = Server(httpd.server_address[1], handler.seen)
    if context is not None:
        context.sni_callback = lambda sock, name, ctx: server.sni.append(name)
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    with serving(httpd):
        yield server


@pytest.fixture
def server() -> Iterator[Server]:
    with http_server() as running:
        yield running


@dataclass
class FakeDns:
    """Names for the fake resolver; a second lookup answers differently, as a rebinding attack."""

    answers: dict[str, list[str]] = field(default_factory=dict)
    lookups: list[str] = field(default_factory=list)


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> FakeDns:
    fake = FakeDns({"rebind.test": ["127.0.0.1", "127.0.0.2"], "other.test": ["127.0.0.1"]})
    real = socket.getaddrinfo

    def getaddrinfo(host: str, port: int, *args: object, **kwargs: object) -> list[tuple]:
        if host not in fake.answers and not host.endswith(".test"):
            return real(host, port, *args, **kwargs)  # IP literals and localhost only
        fake.lookups.append(host)
        if host not in fake.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        answers = fake.answers[host]
        address = answers[min(fake.lookups.count(host), len(answers)) - 1]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return fake


def get(url: str, allow: Allowlist = LOOPBACK, **kwargs: object) -> HttpResult:
    options: dict = {"headers": {}, "body": None, "timeout_s": 5.0, "allow": allow} | kwargs
    method = options.pop("method", "GET")
    return send(method, url, **options)


# --- allowed requests ---------------------------------------------------------------


def test_get_returns_status_headers_and_body(server: Server) -> None:
    result = get(server.url())
    assert result.status == 200
    assert result.headers["content-type"] == "application/json"
    assert result.headers["x-test"] == "yes"
    assert json.loads(result.body) == {
        "method": "GET",
        "host": f"127.0.0.1:{server.port}",
        "body": "",
    }
    assert not result.truncated
    assert result.retry_after_s is None
    assert 0 <= result.duration_ms < 5000


def test_post_sends_body_and_headers(server: Server) -> None:
    headers = {"Content-Type": "application/json", "Idempotency-Key": "exec-1-notify"}
    result = get(server.url("/echo?x=1"), method="POST", headers=headers, body=b'{"a": 1}')
    assert result.status == 200
    assert json.loads(result.body)["body"] == '{"a": 1}'
    [seen] = server.seen
    assert (seen.method, seen.path, seen.body) == ("POST", "/echo?x=1", b'{"a": 1}')
    assert seen.headers["Idempotency-Key"] == "exec-1-notify"
    assert seen.headers["Content-Length"] == "8"


def test_head_has_no_body(server: Server) -> None:
    result = get(server.url(), method="HEAD")
    assert (result.status, result.body, result.truncated) == (200, b"", False)


@pytest.mark.parametrize(
    ("size", "limit", "truncated"),
    [(1000, 100, True), (100, 100, False), (0, 100, False), (300_000, 262_144, True)],
)
def test_body_is_capped(server: Server, size: int, limit: int, truncated: bool) -> None:
    result = get(server.url(f"/bytes?n={size}"), max_response_bytes=limit)
    assert result.body == b"x" * min(size, limit)
    assert result.truncated is truncated


def test_redirect_is_returned_not_followed(server: Server) -> None:
    result = get(server.url("/redirect"))
    assert result.status == 302
    assert result.headers["location"] == "/target"
    assert [seen.path for seen in server.seen] == ["/redirect"]


def test_callers_host_header_wins(server: Server) -> None:
    result = get(server.url(), headers={"host": "vhost.example"})
    assert json.loads(result.body)["host"] == "vhost.example"


def test_hostname_is_resolved_once_and_pinned(server: Server, dns: FakeDns) -> None:
    """The second answer (127.0.0.2, where nothing listens) would break a re-resolving client."""
    result = get(server.url(host="rebind.test"))
    assert json.loads(result.body)["host"] == f"rebind.test:{server.port}"
    assert dns.lookups == ["rebind.test"]


def test_allow_listed_hostname_may_resolve_to_loopback(server: Server, dns: FakeDns) -> None:
    assert get(server.url(host="rebind.test"), Allowlist.parse("rebind.test")).status == 200
    with pytest.raises(RequestRefused):
        get(server.url(host="rebind.test"), Allowlist.parse("other.test"))
    assert len(server.seen) == 1


@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "0177.0.0.1", "127.1"])
def test_odd_ipv4_spellings_are_checked_as_resolved(server: Server, host: str) -> None:
    result = get(server.url(host=host))
    assert json.loads(result.body)["host"] == f"{host}:{server.port}"


# --- refused before anything is sent ------------------------------------------------


@pytest.mark.parametrize(
    ("host", "allow"),
    [
        ("127.0.0.2", LOOPBACK),
        ("0.0.0.0", LOOPBACK),
        ("[::1]", LOOPBACK),
        ("[::ffff:127.0.0.2]", LOOPBACK),
        ("[::ffff:127.0.0.1]", LOOPBACK),
        ("localhost", NOTHING),
        ("127.0.0.1", NOTHING),
        ("2130706433", NOTHING),
        ("0x7f.1", NOTHING),
        ("0177.0.0.1", NOTHING),
    ],
)
def test_non_global_targets_are_refused(server: Server, host: str, allow: Allowlist) -> None:
    with pytest.raises(RequestRefused, match=r"GET http://.*: refused, .* is "):
        get(server.url(host=host), allow)
    assert server.seen == []


def test_refused_name_is_resolved_then_refused(server: Server, dns: FakeDns) -> None:
    with pytest.raises(RequestRefused, match="loopback"):
        get(server.url(host="rebind.test"), NOTHING)
    assert server.seen == []


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://127.0.0.1:{port}/",
        "gopher://127.0.0.1:{port}/",
        "//127.0.0.1:{port}/",
        "127.0.0.1:{port}/echo",
        "http:///echo",
        "http://127.0.0.1:99999/",
        "http://[::1/",
        "http://user:pw@127.0.0.1:{port}/",
        "http://127.0.0.1:{port}/a b",
        "http://127.0.0.1:{port}/a\r\nX-Injected: 1",
        "http://127.0.0.1:{port}/caf\u00e9",
    ],
)
def test_bad_urls_are_not_sent(server: Server, url: str) -> None:
    with pytest.raises(RequestInvalid):
        get(url.format(port=server.port))
    assert server.seen == []


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Token": "s3cret\r\nX-Injected: 1"},
        {"X-Token": "s3cret\nX-Injected: 1"},
        {"X-Token": "s3cret\r"},
        {"X-Token": "s3cret\x00"},
        {"X-Token\r\nX-Injected": "s3cret"},
        {"Bad Name": "s3cret"},
        {"": "s3cret"},
    ],
)
def test_header_injection_is_not_sent(server: Server, headers: dict[str, str]) -> None:
    with pytest.raises(NotSent) as info:
        get(server.url(), headers=headers)
    assert "s3cret" not in str(info.value)
    assert server.seen == []


def test_bad_method_is_not_sent(server: Server) -> None:
    with pytest.raises(NotSent):
        get(server.url(), method="GET /other HTTP/1.1\r\nX:")
    assert server.seen == []


def test_dns_failure_is_not_sent(dns: FakeDns) -> None:
    with pytest.raises(NotSent, match="DNS resolution failed") as info:
        get("http://missing.test/", Allowlist.parse("missing.test"))
    assert type(info.value) is NotSent


# --- transport failures -------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connection_refused_is_not_sent() -> None:
    port = closed_port()
    with pytest.raises(NotSent, match=rf"GET http://127.0.0.1:{port}: .*ConnectionRefused") as info:
        get(f"http://127.0.0.1:{port}/")
    assert type(info.value) is NotSent


def test_connect_timeout_is_not_sent() -> None:
    """A listener with a full accept queue drops SYNs, so connecting times out."""
    with socket.create_server(("127.0.0.1", 0), backlog=0) as listener:
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.settimeout(0.2)
            with contextlib.suppress(OSError):
                filler.connect(("127.0.0.1", port))
        try:
            started = time.monotonic()
            with pytest.raises(NotSent, match="TimeoutError: timed out") as info:
                get(f"http://127.0.0.1:{port}/", connect_timeout_s=0.5)
            assert type(info.value) is NotSent
            assert time.monotonic() - started < 3
        finally:
            for filler in fillers:
                filler.close()


Behaviour = Callable[[socket.socket, threading.Event], None]


@contextlib.contextmanager
def raw_server(behaviour: Behaviour) -> Iterator[tuple[int, list[bytes]]]:
    """A one-connection server on 127.0.0.1 that reads the whole request, then misbehaves."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(5)
                request = conn.makefile("rb")
                head = b""
                while (line := request.readline()) not in (b"\r\n", b""):
                    head += line
                length = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
                received.append(head + request.read(int(length[1]) if length else 0))
                behaviour(conn, stop)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], received
    finally:
        stop.set()
        listener.close()
        thread.join(5)


def hang(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(10)


def close_silently(conn: socket.socket, stop: threading.Event) -> None:
    pass


def reset(conn: socket.socket, stop: threading.Event) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def half_response(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")


def drip_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    with contextlib.suppress(OSError):
        while not stop.wait(0.05):
            conn.sendall(b"x")


def drip_headers(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    with contextlib.suppress(OSError):
        while not stop.wait(0.05):
            conn.sendall(b"y")


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        (hang, "response too slow"),
        (close_silently, "RemoteDisconnected"),
        (reset, "ConnectionReset"),
        (half_response, "IncompleteRead|ProtocolError"),
        (drip_body, "response too slow"),
        (drip_headers, "response too slow"),
    ],
)
def test_failures_after_sending_are_sent_no_response(behaviour: Behaviour, reason: str) -> None:
    with raw_server(behaviour) as (port, received):
        started = time.monotonic()
        with pytest.raises(SentNoResponse, match=reason) as info:
            get(
                f"http://127.0.0.1:{port}/orders?token=s3cret",
                method="POST",
                headers={"Authorization": "Bearer s3cret"},
                body=b"s3cret",
                timeout_s=0.5,
            )
        assert time.monotonic() - started < 3
    assert received and received[0].startswith(b"POST /orders?token=s3cret HTTP/1.1")
    assert str(info.value).startswith(f"POST http://127.0.0.1:{port}: ")
    assert "s3cret" not in str(info.value)


# --- Retry-After --------------------------------------------------------------------


def http_date(offset_s: float) -> str:
    return email.utils.formatdate(time.time() + offset_s, usegmt=True)


@pytest.mark.parametrize(
    ("value", "low", "high"),
    [
        (lambda: "120", 120, 120),
        (lambda: "0", 0, 0),
        (lambda: http_date(600), 590, 600),
        (lambda: http_date(-600), 0, 0),
    ],
    ids=["seconds", "zero", "future-date", "past-date"],
)
def test_retry_after_is_parsed(
    server: Server, value: Callable[[], str], low: float, high: float
) -> None:
    result = get(server.url(f"/retry-after?value={quote(value())}"))
    assert result.status == 429
    assert result.retry_after_s is not None
    assert low <= result.retry_after_s <= high


@pytest.mark.parametrize("value", [None, "soon", "-5", "1.5", "12345678901", "Mon, 99 Foo"])
def test_invalid_or_absent_retry_after_is_none(server: Server, value: str | None) -> None:
    path = "/retry-after" if value is None else f"/retry-after?value={quote(value)}"
    assert get(server.url(path)).retry_after_s is None


# --- TLS: SNI and certificate checks use the URL's hostname, not the pinned IP -------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for rebind.test, made with the openssl command."""
    if shutil.which("openssl") is None:
        unavailable("the openssl command")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=rebind.test"),
            *("-addext", "subjectAltName=DNS:rebind.test"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_server(certificate: tuple[Path, Path]) -> Iterator[Server]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    with http_server(context) as running:
        yield running


@pytest.fixture
def trust_test_certificate(monkeypatch: pytest.MonkeyPatch, certificate: tuple[Path, Path]) -> None:
    """Make the test certificate the only trusted root for clients that load default certs."""

    def load_default_certs(self: ssl.SSLContext, purpose: object = None) -> None:
        self.load_verify_locations(certificate[0])

    monkeypatch.setattr(ssl.SSLContext, "load_default_certs", load_default_certs)


@pytest.mark.usefixtures("trust_test_certificate")
def test_https_verifies_against_the_url_hostname(tls_server: Server, dns: FakeDns) -> None:
    result = get(tls_server.url(host="rebind.test", scheme="https"))
    assert json.loads(result.body)["host"] == f"rebind.test:{tls_server.port}"
    assert tls_server.sni == ["rebind.test"]


@pytest.mark.usefixtures("trust_test_certificate")
def test_https_hostname_mismatch_is_not_sent(tls_server: Server, dns: FakeDns) -> None:
    with pytest.raises(NotSent, match="CertificateError"):
        get(tls_server.url(host="other.test", scheme="https"))
    assert tls_server.sni == ["other.test"]
    assert tls_server.seen == []


def test_https_untrusted_certificate_is_not_sent(tls_server: Server, dns: FakeDns) -> None:
    with pytest.raises(NotSent, match="CERTIFICATE_VERIFY_FAILED"):
        get(tls_server.url(host="rebind.test", scheme="https"))
    assert tls_server.seen == []
