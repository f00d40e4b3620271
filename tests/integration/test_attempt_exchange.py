"""Each attempt keeps what it sent and what came back (attempts.request / .response),
through a real bin/worker against 127.0.0.1 targets: written with the claim, so the
request is in the database before its first byte reaches the target; each retry keeps its
own answer; an attempt whose connection broke mid-response shows its request and no
answer; secrets and bodies are redacted and cut exactly as step outputs are."""

from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from flowforge.steps.http_step import ATTEMPT_BODY_BYTES
from tests.faults.helpers import cli
from tests.support.api import Api, step
from tests.support.definitions import http, unsigned
from tests.support.processes import Process
from tests.support.target import Received, Reply, Target

REDACTED = "[redacted]"
WORKFLOW = "pays"


def pay(url: str, **request: Any) -> dict[str, Any]:
    """A POST carrying the secret in its URL, a header and its JSON body."""
    return unsigned(
        [
            http(
                "pay",
                "POST",
                f"{url}/orders/{{{{ input.order }}}}?key={{{{ secrets.tok }}}}",
                retry={"max_attempts": 3, "initial_interval_s": 0.1},
                headers={"X-Api-Token": "{{ secrets.tok }}"},
                json={"token": "{{ secrets.tok }}", "order": "{{ input.order }}"},
                **request,
            )
        ],
        name="Pays",
    )


@pytest.fixture
def value() -> str:
    return "Tok/" + secrets.token_hex(12) + "+="


def test_each_attempt_keeps_its_own_redacted_request_and_response(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
    value: str,
) -> None:
    stored_when_it_arrived: list[Any] = []

    def answer(request: Received) -> Reply:
        # Read while the target holds the request: the claim committed it before sending.
        stored_when_it_arrived.append(
            db.execute("SELECT request FROM attempts ORDER BY id DESC LIMIT 1").fetchone()
        )
        token = request.headers["x-api-token"]
        if len(target.received) == 1:
            return Reply(status=503, json={"busy": token}, headers={"Retry-After": "0"})
        # Longer than an attempt keeps, with the echoed token across the cut.
        pad = "x" * (ATTEMPT_BODY_BYTES - len(token) // 2)
        body = (pad + token + "y" * 6_000).encode()
        return Reply(body=body, headers={"Content-Type": "text/plain", "X-Request-Id": token})

    target.script = answer
    workers(FLOWFORGE_SECRET_TOK=value, FLOWFORGE_SECRET_TOK_WORKFLOWS=WORKFLOW)
    client = Api(api, api_key)
    client.publish(WORKFLOW, pay(target.url, idempotency_key="{{ execution.id }}-pay"))
    eid = client.start(WORKFLOW, {"order": "A1"})
    done = client.wait(eid)
    assert done["status"] == "succeeded", done
    assert [r.headers["x-api-token"] for r in target.received] == [value, value]

    first, second = step(done, "pay")["attempts"]
    sent = {
        "method": "POST",
        "url": f"{target.url}/orders/A1?key={REDACTED}",
        "headers": {
            "X-Api-Token": REDACTED,
            "Content-Type": "application/json",
            "Idempotency-Key": f"{eid}-pay",
        },
        "body": target.received[0].body.decode().replace(value, REDACTED),
        "truncated": False,
    }
    assert REDACTED in sent["body"] and '"order":"A1"' in sent["body"]
    assert first["request"] == sent and second["request"] == sent
    assert stored_when_it_arrived == [(sent,), (sent,)]

    assert (first["outcome"], first["response"]["status"]) == ("failed", 503)
    assert first["response"]["body"] == f'{{"busy": "{REDACTED}"}}'
    assert first["response"]["headers"]["retry-after"] == "0"
    assert (second["outcome"], second["response"]["status"]) == ("succeeded", 200)
    response = second["response"]
    assert response["truncated"] is True
    assert response["body"].endswith(f"x{REDACTED}"), response["body"][-40:]
    assert response["headers"]["x-request-id"] == REDACTED
    # The step's output is the last response up to the worker's own, larger, limit.
    assert step(done, "pay")["output"]["body"].endswith("y" * 6_000)

    answer_text = client.session.get(f"{api}/api/v1/executions/{eid}", timeout=10).text
    columns = db.execute("SELECT request::text, response::text FROM attempts").fetchall()
    for where, text in {"the API's answer": answer_text, "attempts": repr(columns)}.items():
        assert value not in text and value.lower() not in text.lower(), where
        assert value[4:12] not in text, f"the start of the secret is in {where}"


@pytest.fixture
def dropping() -> Iterator[tuple[str, list[bytes]]]:
    """A 127.0.0.1 server that reads each request, starts its answer and hangs up."""
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < length(data):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        return data

    def length(data: bytes) -> int:
        head = data.partition(b"\r\n\r\n")[0].lower()
        return (
            int(head.split(b"content-length:")[1].split(b"\r\n")[0])
            if b"content-length:" in head
            else 0
        )

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # shut down
            with conn:
                seen.append(read_request(conn))
                conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{"id":')

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", seen
    server.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone would not)
    server.close()
    thread.join(timeout=5)


def test_an_attempt_whose_connection_broke_shows_what_it_sent_and_no_answer(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    dropping: tuple[str, list[bytes]],
    env: dict[str, str],
    value: str,
) -> None:
    url, seen = dropping
    workers(
        FLOWFORGE_SECRET_TOK=value,
        FLOWFORGE_SECRET_TOK_WORKFLOWS=WORKFLOW,
        FLOWFORGE_WORKER_ID="worker-dropped",
    )
    client = Api(api, api_key)
    client.publish(WORKFLOW, pay(url))
    eid = client.start(WORKFLOW, {"order": "B2"})
    done = client.wait(eid, "needs_attention", timeout=30)
    assert len(seen) == 1 and value.encode() in seen[0]

    [attempt] = step(done, "pay")["attempts"]
    assert attempt["outcome"] == "unknown" and attempt["worker"] == "worker-dropped"
    assert attempt["response"] is None
    assert attempt["request"]["url"] == f"{url}/orders/B2?key={REDACTED}"
    assert attempt["request"]["headers"]["X-Api-Token"] == REDACTED
    assert attempt["request"]["body"] == '{"order":"B2","token":"[redacted]"}'

    shown = cli(env, "executions", "show", eid)
    assert shown.returncode == 0, shown.stderr
    assert f"sent POST {url}/orders/B2?key={REDACTED}" in shown.stdout
    assert "no answer (by worker-dropped)" in shown.stdout
    assert value not in shown.stdout
