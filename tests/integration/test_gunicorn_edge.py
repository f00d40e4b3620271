"""What gunicorn does before (and around) Flask, against the real bin/api over raw sockets:
its own errors are RFC 9457 problem documents, its request limits are FlowForge's, and
every line it logs is JSON that holds no API key, Basic-auth user or query string."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from flowforge.api.serve import gunicorn_argv
from tests.support.api import Api
from tests.support.definitions import OPEN
from tests.support.processes import Process, start_api


@dataclass
class Server:
    process: Process
    base: str

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.base)
        return parts.hostname or "", parts.port or 0


@pytest.fixture
def server(env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    process, base = start_api(env, tmp_path / "api.log", workers=1)
    yield Server(process, base)
    process.stop()


@dataclass
class Raw:
    status: int
    headers: dict[str, str]
    body: bytes


def raw(server: Server, request: bytes) -> Raw:
    """Send bytes as they are and read the answer until the server closes."""
    with socket.create_connection(server.address, timeout=10) as sock:
        # The server may answer and close before it has read everything.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Raw(int(status_line.split()[1]), headers, body)


def assert_problem(answer: Raw, status: int) -> dict[str, object]:
    assert answer.status == status, answer
    assert answer.headers["content-type"] == "application/problem+json", answer
    assert int(answer.headers["content-length"]) == len(answer.body)
    document = json.loads(answer.body)
    assert document["status"] == status
    assert str(document["type"]).startswith("urn:flowforge:problem:")
    assert {"title", "detail"} <= document.keys()
    return document


SECRET_IN_QUERY = "qs-secret-3f9a1c"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /?token=" + SECRET_IN_QUERY.encode() + b"a" * 5000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-H: 1\r\n" * 120 + b"\r\n", 431),
        (b"GET /?token=" + SECRET_IN_QUERY.encode() + b" HTTP/1.1 extra\r\n\r\n", 400),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 400),
        (
            b"POST /hooks/open HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
    ],
    ids=[
        "long-line-414",
        "big-header-431",
        "many-headers-431",
        "bad-request-line",
        "garbage",
        "bad-header-name",
        "length-and-chunked",
    ],
)
def test_gunicorn_errors_are_problem_json(
    server: Server, request_bytes: bytes, status: int
) -> None:
    document = assert_problem(raw(server, request_bytes), status)
    assert SECRET_IN_QUERY not in json.dumps(document)


def test_a_broken_chunked_body_is_a_400_problem_not_a_500(server: Server, api_key: str) -> None:
    """Bad framing found while Flask reads the body is the client's fault, like the rest."""
    Api(server.base, api_key).publish("open", OPEN)
    answer = raw(
        server,
        b"POST /hooks/open HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    )
    assert_problem(answer, 400)
    assert '"unhandled error"' not in server.process.log()


def test_limits_are_flowforges_not_gunicorns_defaults(server: Server) -> None:
    """60 header fields pass gunicorn's default of 100; FlowForge allows 50."""
    many = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-H: 1\r\n" * 59 + b"\r\n"
    assert_problem(raw(server, many), 431)
    fine = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-H: 1\r\n" * 40 + b"\r\n"
    assert raw(server, fine).status == 200
    # A request line of 3000 bytes passes gunicorn's default of 4094; FlowForge allows 2048.
    assert_problem(raw(server, b"GET /healthz?" + b"x" * 3000 + b" HTTP/1.1\r\n\r\n"), 414)


def test_operator_options_still_win_over_the_defaults() -> None:
    """gunicorn takes the last of a repeated option: the operator's come after FlowForge's."""
    argv = gunicorn_argv(["--limit-request-fields", "80", "--timeout", "60"], {})

    def last(flag: str) -> str:
        return argv[len(argv) - argv[::-1].index(flag)]

    assert (last("--limit-request-fields"), last("--timeout")) == ("80", "60")
    assert "--no-control-socket" in argv
    own = gunicorn_argv(["--control-socket", "/run/flowforge/api.ctl"], {})
    assert "--no-control-socket" not in own


def test_every_log_line_is_json_and_holds_no_key_user_or_query(
    env: dict[str, str], tmp_path: Path, api_key: str
) -> None:
    process, base = start_api(env, tmp_path / "api.log", workers=1)
    secrets = [api_key, "query-secret-77e1", "basic-user-secret-5b2"]
    try:
        requests.get(f"{base}/api/v1/workflows", auth=(api_key, ""), timeout=10)
        requests.get(f"{base}/api/v1/workflows", auth=("basic-user-secret-5b2", "pw"), timeout=10)
        bearer = {"Authorization": f"Bearer {api_key}"}
        listed = requests.get(
            f"{base}/api/v1/workflows?x=query-secret-77e1", headers=bearer, timeout=10
        )
        assert listed.status_code == 200
        request_id = listed.headers["X-Request-Id"]
        requests.post(f"{base}/hooks/none?token=query-secret-77e1", json={}, timeout=10)
        signed = {"name": "Signed", "steps": OPEN["steps"]}
        Api(base, api_key).publish("signed", signed)
        refused = requests.post(f"{base}/hooks/signed", json={}, timeout=10)
        assert refused.status_code == 401
        server = Server(process, base)
        raw(server, b"GET /?token=query-secret-77e1" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n")
        raw(server, b"GET /?token=query-secret-77e1 HTTP/1.1 extra\r\n\r\n")
    finally:
        process.stop()
    log = process.log()
    records = []
    for line in log.splitlines():
        if line.strip():
            records.append(json.loads(line))  # every line is JSON
    for secret in secrets:
        assert secret not in log
    access = [r for r in records if r.get("logger") == "gunicorn.access"]
    listing = next(r for r in access if r.get("request_id") == request_id)
    assert listing["method"] == "GET"
    assert listing["path"] == "/api/v1/workflows"
    assert listing["status"] == 200
    assert isinstance(listing["duration_ms"], float)
    assert any(r["status"] == 414 for r in access)
    # The application's own lines carry the id of the request they were written for.
    app_line = next(r for r in records if r["msg"] == "webhook refused")
    assert app_line["request_id"] == refused.headers["X-Request-Id"]
    # gunicorn's own start-up lines are JSON too.
    assert any(
        r.get("logger") == "gunicorn.error" and "Booting worker" in r["msg"] for r in records
    )
