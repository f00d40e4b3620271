"""Hostile input gets a 4xx problem document, never a 500, a stack trace or an echo.

Templates are data lookups only, so template-injection payloads are refused at publish
with the JSON path of each; bodies are bounded in size, type, encoding and nesting; and
what PostgreSQL's jsonb cannot hold (NUL, lone surrogates, infinite numbers) is a 400
rather than a database error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import requests

from tests.support.api import Api, step
from tests.support.definitions import OPEN
from tests.support.problems import PROBLEM, assert_problem
from tests.support.processes import Process
from tests.support.target import Target

LIMIT = 65_536  # max_body_bytes of the app_client fixture


def executions(db: psycopg.Connection) -> int:
    return db.execute("SELECT count(*) FROM executions").fetchone()[0]


# --- templates: data lookups only --------------------------------------------------------

INJECTIONS = [
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ input.__class__ }}",
    "{{ input.x.__dict__ }}",
    "{{ input.x | upper }}",
    "{{ input.x|safe }}",
    "{{ input.a + 1 }}",
    "{{ 7*7 }}",
    "{{ input['x'] }}",
    "{{ input.x() }}",
    "{{ lipsum.__globals__.os.popen('id').read() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ input.x if input.y else input.z }}",
    "{{ {{ input.x }} }}",
    "{{ input.x }",
    "{{ }}",
    "{{ config }}",
    "{{ self }}",
    "{{ request.environ }}",
    "{{ execution.__init__ }}",
    "{{ execution.secret_key }}",
]


@pytest.mark.parametrize("template", INJECTIONS)
def test_template_injection_is_refused_at_publish(open_client: Any, template: str) -> None:
    definition = {**OPEN, "steps": [{"id": "t", "type": "transform", "output": {"x": template}}]}
    body = assert_problem(open_client.post("/api/v1/workflows/evil/versions", json=definition), 422)
    assert [e["path"] for e in body["errors"]] == ["$.steps[0].output.x"]
    assert open_client.get("/api/v1/workflows/evil").status_code == 404


def test_every_injected_template_is_reported_with_its_path(open_client: Any) -> None:
    """One 422 that names each bad place: URL, header, body, idempotency key, delay, when."""
    definition = {
        "name": "Many problems",
        "steps": [
            {
                "id": "call",
                "type": "http_request",
                "request": {
                    "method": "POST",
                    "url": "http://127.0.0.1/{{ ''.__class__ }}",
                    "headers": {"X-A": "{{ input.a | lower }}"},
                    "json": {"deep": [{"x": "{{ 1 + 1 }}"}]},
                    "idempotency_key": "{{ input.__dict__ }}",
                },
            },
            {"id": "wait", "type": "delay", "until": "{{ input.t.__str__ }}"},
            {
                "id": "shape",
                "type": "transform",
                "when": {"path": "input.__class__", "op": "exists"},
                "output": "{{ call.body() }}",
            },
        ],
    }
    body = assert_problem(open_client.post("/api/v1/workflows/evil/versions", json=definition), 422)
    assert sorted(e["path"] for e in body["errors"]) == sorted(
        [
            "$.steps[0].request.url",
            "$.steps[0].request.headers.X-A",
            "$.steps[0].request.json.deep[0].x",
            "$.steps[0].request.idempotency_key",
            "$.steps[1].until",
            "$.steps[2].when.path",
            "$.steps[2].output",
        ]
    )
    assert all(e["message"] for e in body["errors"])


def test_values_are_inserted_as_data_never_spliced_into_json() -> None:
    """An input that looks like JSON or a template stays one string when it is rendered."""
    from flowforge.domain.definitions import parse_definition
    from flowforge.domain.templating import render

    definition = parse_definition(
        {**OPEN, "steps": [{"id": "t", "type": "transform", "output": {"a": "{{ input.x }}"}}]}
    )
    hostile = '", "admin": true, "x": "{{ secrets.token }}'
    rendered = render(definition.step("t").output, {"input": {"x": hostile}})
    assert rendered == {"a": hostile}


# --- header values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "path"),
    [
        ({"X-Note": "a\r\nX-Injected: 1"}, "$.steps[0].request.headers.X-Note"),
        ({"X-Note": "a\nb"}, "$.steps[0].request.headers.X-Note"),
        ({"X-Note": "a\rb"}, "$.steps[0].request.headers.X-Note"),
        ({"X-Note\r\nX-Injected": "1"}, "$.steps[0].request.headers.X-Note\r\nX-Injected"),
        ({"Bad Name": "1"}, "$.steps[0].request.headers.Bad Name"),
    ],
)
def test_crlf_in_literal_headers_is_refused_at_publish(
    open_client: Any, headers: dict[str, str], path: str
) -> None:
    definition = {
        **OPEN,
        "steps": [
            {
                "id": "call",
                "type": "http_request",
                "request": {"method": "GET", "url": "http://127.0.0.1/", "headers": headers},
            }
        ],
    }
    body = assert_problem(open_client.post("/api/v1/workflows/evil/versions", json=definition), 422)
    assert path in [e["path"] for e in body["errors"]]


def test_crlf_rendered_from_input_fails_the_step_and_sends_nothing(
    api: str, api_key: str, workers: Callable[..., Process], target: Target
) -> None:
    """The header is fine at publish; the event's value is not, so the step fails unsent."""
    workers()
    client = Api(api, api_key)
    client.publish(
        "relay",
        {
            **OPEN,
            "steps": [
                {
                    "id": "call",
                    "type": "http_request",
                    "request": {
                        "method": "POST",
                        "url": f"{target.url}/in",
                        "headers": {"X-Note": "note: {{ input.note }}"},
                        "json": {"note": "{{ input.note }}", "admin": False},
                    },
                }
            ],
        },
    )
    injected = "hello\r\nX-Injected: yes\r\n\r\nGET /smuggled HTTP/1.1"
    done = client.wait(client.start("relay", {"note": injected}), timeout=60)
    assert done["status"] == "failed", done
    call = step(done, "call")
    assert "header X-Note has a control or non-Latin-1 character" in call["error"]
    assert "X-Injected" not in call["error"] and "hello" not in call["error"]
    assert call["attempts"] and all(a["http_status"] is None for a in call["attempts"])
    assert target.received == []
    # The same workflow with a clean value goes through: the refusal was about the value.
    # Quotes in it stay data: the JSON body is built from parsed values, never spliced text.
    clean = 'fine", "admin": true, "x": "'
    assert client.wait(client.start("relay", {"note": clean}))["status"] == "succeeded"
    [sent] = target.received
    assert sent.headers["x-note"] == f"note: {clean}"
    assert sent.json() == {"note": clean, "admin": False}


# --- bodies -------------------------------------------------------------------------------


def test_body_over_the_limit_is_413(open_client: Any, db: psycopg.Connection) -> None:
    big = json.dumps({"x": "a" * LIMIT}).encode()
    for path in ("/hooks/open", "/api/v1/workflows/open/versions"):
        r = open_client.post(path, data=big, headers={"Content-Type": "application/json"})
        assert "65536" in assert_problem(r, 413)["detail"]
    fits = json.dumps({"x": "a" * (LIMIT - 20)}).encode()
    assert len(fits) <= LIMIT
    assert (
        open_client.post("/hooks/open", data=fits, content_type="application/json").status_code
        == 202
    )
    assert executions(db) == 1


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_wrong_content_type_is_415(
    open_client: Any, db: psycopg.Connection, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/hooks/open", "/api/v1/workflows/open/versions"):
        assert_problem(open_client.post(path, data=b'{"x": 1}', headers=headers), 415)
    assert executions(db) == 0


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZIP", "identity, gzip"])
def test_compressed_bodies_are_415(open_client: Any, db: psycopg.Connection, encoding: str) -> None:
    """A 1 KB gzip can expand to gigabytes: compressed bodies are refused, not inflated."""
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    assert_problem(open_client.post("/hooks/open", data=b'{"x": 1}', headers=headers), 415)
    assert executions(db) == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"password": "hunter2-PRIVATE",',
        b'{"password": "hunter2-PRIVATE"} trailing',
        b"{'password': 'hunter2-PRIVATE'}",
        b'{"password": hunter2-PRIVATE}',
        b'{"password": "hunter2-PRIVATE", "n": NaN}',
        b'{"password": "hunter2-PRIVATE", "n": Infinity}',
        b'{"password": "hunter2-PRIVATE", "n": 1e999}',
        b'{"password": "hunter2-PRIVATE\xff\xfe"}',
        b"",
    ],
)
def test_malformed_json_is_400_without_echo(
    open_client: Any, db: psycopg.Connection, raw: bytes
) -> None:
    for path in ("/hooks/open", "/api/v1/workflows/open/versions"):
        r = open_client.post(path, data=raw, content_type="application/json")
        assert_problem(r, 400)
        assert "hunter2" not in r.get_data(as_text=True)
    assert executions(db) == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"x": "a\\u0000b"}',
        b'{"x\\u0000": 1}',
        b'{"x": "\\ud800"}',
        b'{"x": ["ok", {"y": "\\udfff"}]}',
    ],
    ids=["nul-value", "nul-key", "lone-high-surrogate", "nested-low-surrogate"],
)
def test_json_that_jsonb_cannot_hold_is_400(
    open_client: Any, db: psycopg.Connection, raw: bytes
) -> None:
    """Valid JSON, but PostgreSQL refuses it: found by fuzzing, formerly a 500."""
    for path in ("/hooks/open", "/api/v1/workflows/open/versions"):
        assert_problem(open_client.post(path, data=raw, content_type="application/json"), 400)
    assert executions(db) == 0
    # A proper surrogate pair is an ordinary character and is accepted.
    ok = open_client.post(
        "/hooks/open", data=b'{"x": "\\ud83d\\ude00"}', content_type="application/json"
    )
    assert ok.status_code == 202


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 60_000,
        b"[" * 30_000 + b"]" * 30_000,
        b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
    ],
    ids=["unclosed", "closed", "objects"],
)
def test_deep_nesting_is_4xx_never_500(
    open_client: Any, db: psycopg.Connection, raw: bytes
) -> None:
    assert len(raw) <= LIMIT
    for path in ("/hooks/open", "/api/v1/workflows/open/versions"):
        assert_problem(
            open_client.post(path, data=raw, content_type="application/json"), (400, 422)
        )
    assert executions(db) == 0


def test_deep_definition_is_422_naming_the_limit(open_client: Any) -> None:
    nested: Any = "leaf"
    for _ in range(200):
        nested = {"n": nested}
    definition = {**OPEN, "steps": [{"id": "t", "type": "transform", "output": nested}]}
    body = assert_problem(open_client.post("/api/v1/workflows/deep/versions", json=definition), 422)
    assert "nesting exceeds the limit" in body["errors"][0]["message"]


def test_resolve_body_is_checked_like_the_others(open_client: Any) -> None:
    eid = open_client.post("/hooks/open", json={"x": 1}).get_json()["execution_id"]
    path = f"/api/v1/executions/{eid}/steps/shape/resolve"
    assert_problem(open_client.post(path, data=b"[" * 60_000, content_type="application/json"), 400)
    assert_problem(open_client.post(path, data=b"{", content_type="application/json"), 400)
    assert_problem(open_client.post(path, data=b'{"outcome": "x"}', content_type="text/plain"), 415)
    assert_problem(open_client.post(path, json={"outcome": "maybe"}), 422)
    assert_problem(open_client.post(path, json=["outcome"]), 422)


# --- headers, query strings, routes -------------------------------------------------------


@pytest.mark.parametrize("suffix", ["%0A", "%0D%0A", "%00", "%0A%0A"])
def test_identifiers_with_a_trailing_newline_are_4xx(
    open_client: Any, db: psycopg.Connection, suffix: str
) -> None:
    """`$` in a Python regex matches before a final newline; every identifier taken from a
    request is a full match, so "open\n" is no workflow key (nor "open\x00")."""
    published = open_client.post(f"/api/v1/workflows/new{suffix}/versions", json=OPEN)
    assert_problem(published, 422)
    assert_problem(open_client.post(f"/hooks/open{suffix}", json={"x": 1}), 404)
    assert_problem(open_client.get(f"/api/v1/workflows/open{suffix}"), 404)
    assert_problem(open_client.get(f"/api/v1/workflows/open{suffix}/versions/1"), 404)
    assert_problem(open_client.post(f"/api/v1/workflows/open{suffix}/webhook-secrets"), 404)
    assert_problem(open_client.get(f"/api/v1/executions?workflow=open{suffix}"), 400)
    execution_id = open_client.post("/hooks/open", json={"x": 1}).get_json()["execution_id"]
    resolved = open_client.post(
        f"/api/v1/executions/{execution_id}/steps/shape{suffix}/resolve",
        json={"outcome": "failed"},
    )
    # A NUL is text no route takes (docs/reference/http-api.md): 400 before the route runs.
    assert_problem(resolved, 400 if suffix == "%00" else 404)
    assert db.execute("SELECT count(*) FROM workflows").fetchone()[0] == 1


def test_query_strings_on_webhooks_are_400(open_client: Any, db: psycopg.Connection) -> None:
    for query in ("a=1", "a=" + "x" * 100_000, "%00=%ff", "x" * 8000):
        assert_problem(open_client.post(f"/hooks/open?{query}", json={"x": 1}), 400)
    assert executions(db) == 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Idempotency-Key", "k" * 256),
        ("Idempotency-Key", "k\x7fk"),
        ("Idempotency-Key", "\t"),
        ("webhook-id", "w" * 10_000),
    ],
)
def test_abusive_idempotency_headers_are_400(
    open_client: Any, db: psycopg.Connection, name: str, value: str
) -> None:
    assert_problem(open_client.post("/hooks/open", json={"x": 1}, headers={name: value}), 400)
    assert executions(db) == 0


def test_huge_unrelated_headers_do_not_break_a_signed_hook(open_client: Any) -> None:
    """The signature check ignores them and answers 401 as for any unsigned call."""
    signed = {key: value for key, value in OPEN.items() if key != "trigger"}
    assert open_client.post("/api/v1/workflows/signed/versions", json=signed).status_code == 201
    headers = {"X-Junk": "j" * 100_000, "webhook-signature": "v1," + "A" * 50_000}
    headers |= {"webhook-id": "m", "webhook-timestamp": "9" * 15}
    assert_problem(open_client.post("/hooks/signed", json={"x": 1}, headers=headers), 401)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("get", "/", 404),
        ("get", "/nope", 404),
        ("get", "/api/v2/workflows", 404),
        ("get", "/hooks/open/extra", 404),
        ("post", "/hooks/UPPER", 404),
        ("post", "/hooks/" + "a" * 65, 404),
        ("post", "/hooks/..%2f..%2fetc", 404),
        ("get", "/hooks/open", 405),
        ("put", "/hooks/open", 405),
        ("delete", "/api/v1/workflows/open", 405),
        ("patch", "/api/v1/executions", 405),
        ("post", "/healthz", 405),
        ("get", "/api/v1/executions/not-a-uuid", 404),
        ("get", "/api/v1/executions/00000000-0000-0000-0000-00000000000g", 404),
        ("get", "/api/v1/executions/" + "1" * 5000, 404),
        ("post", "/api/v1/executions/'; DROP TABLE executions; --/cancel", 404),
        ("get", "/api/v1/executions/00000000-0000-0000-0000-000000000000", 404),
        ("get", "/api/v1/workflows/open/versions/0", 404),
        ("get", "/api/v1/workflows/open/versions/-1", 404),
        ("get", "/api/v1/workflows/open/versions/99999999999999999999", 404),
        ("get", "/api/v1/executions?workflow=%00", 400),
        ("get", "/api/v1/executions?limit=1e9", 400),
        ("get", "/api/v1/executions?limit=0", 400),
        ("get", "/api/v1/executions?status=nope", 400),
        ("get", "/api/v1/executions?cursor=%ff%fe", 400),
        ("get", "/api/v1/executions?cursor=" + "A" * 10_000, 400),
    ],
)
def test_routes_answer_problem_documents(
    open_client: Any, db: psycopg.Connection, method: str, path: str, status: int
) -> None:
    body = assert_problem(getattr(open_client, method)(path, json={"x": 1}), status)
    if status == 405:
        assert getattr(open_client, method)(path, json={"x": 1}).headers["Allow"]
    assert body["detail"]
    assert db.execute("SELECT count(*) FROM executions").fetchone()[0] == 0


# --- through gunicorn: what the in-process client cannot show -----------------------------


def test_oversized_requests_through_bin_api_are_4xx(api: str, api_key: str) -> None:
    """Chunked bodies have no Content-Length to check, and gunicorn parses headers first."""
    client = Api(api, api_key)
    client.publish("open", OPEN)
    url = f"{api}/hooks/open"
    headers = {"Content-Type": "application/json"}

    def chunks() -> Iterator[bytes]:
        yield b'{"x": "'
        for _ in range(1100):
            yield b"a" * 1024
        yield b'"}'

    r = requests.post(url, data=chunks(), headers=headers, timeout=30)
    assert r.status_code == 413, r.text
    assert r.headers["Content-Type"] == PROBLEM
    # Valid JSON up to the limit and padding past it was once cut and accepted silently.
    limit = 1_048_576
    padded = b'{"x": 1}' + b" " * limit
    r = requests.post(url, data=iter([padded[:limit], padded[limit:]]), headers=headers, timeout=30)
    assert r.status_code == 413, r.text
    exact = b'{"x": 1}' + b" " * (limit - 8)
    r = requests.post(url, data=iter([exact[:1000], exact[1000:]]), headers=headers, timeout=30)
    assert r.status_code == 202, r.text
    deep = requests.post(url, data=b"[" * 100_000, headers=headers, timeout=30)
    assert deep.status_code in (400, 422) and deep.headers["Content-Type"] == PROBLEM
    # Header and request-line limits belong to gunicorn: a 4xx, never a 5xx or a trace.
    for extra, query in (({"X-Junk": "j" * 20_000}, ""), ({}, "?" + "q" * 20_000)):
        r = requests.post(url + query, data=b"{}", headers={**headers, **extra}, timeout=30)
        assert 400 <= r.status_code < 500, r.status_code
        assert "Traceback" not in r.text
    assert requests.get(f"{api}/healthz", timeout=10).status_code == 200


# --- hostile responses: what a remote server sends back must not block the checkpoint -----

HOSTILE_REPLIES = {
    "nul-text": (b"a\x00b", "text/plain", "a\ufffdb"),
    "nul-json": (b'{"a": "\\u0000"}', "application/json", '{"a": "\\u0000"}'),
    "surrogate": (b'{"a": "\\ud800"}', "application/json", '{"a": "\\ud800"}'),
    "infinite": (b'{"n": 1e999}', "application/json", '{"n": 1e999}'),
    "nan": (b'{"n": NaN}', "application/json", '{"n": NaN}'),
    "deep": (b"[" * 5000 + b"]" * 5000, "application/json", "[" * 5000 + "]" * 5000),
    # Parsed by the worker's idle thread, once stored as JSON that the API (on a deeper
    # stack) could not load again: every GET of the execution answered 500.
    "nested-975": (b"[" * 975 + b"]" * 975, "application/json", "[" * 975 + "]" * 975),
}


def test_hostile_responses_are_stored_as_text_not_retried(
    api: str, api_key: str, workers: Callable[..., Process], target: Target
) -> None:
    """JSON that jsonb cannot hold once made every checkpoint fail: the lease expired and
    the request was sent again, three times. Now it is kept as text after one attempt."""
    from tests.support.target import Received, Reply

    def reply(request: Received) -> Reply:
        body, content_type, _ = HOSTILE_REPLIES[request.path.removeprefix("/r/")]
        return Reply(body=body, headers={"Content-Type": content_type, "X-Request-Id": "r\x00"})

    target.script = reply
    workers()
    client = Api(api, api_key)
    fetch = {"method": "GET", "url": f"{target.url}/r/{{{{ input.path }}}}"}
    client.publish(
        "fetch", {**OPEN, "steps": [{"id": "fetch", "type": "http_request", "request": fetch}]}
    )
    started = {path: client.start("fetch", {"path": path}) for path in HOSTILE_REPLIES}
    for path, eid in started.items():
        done = client.wait(eid)
        assert done["status"] == "succeeded", (path, step(done, "fetch")["error"])
        output = step(done, "fetch")["output"]
        assert output["body"] == HOSTILE_REPLIES[path][2], path
        assert output["headers"]["x-request-id"] == "r\ufffd"
        assert len(step(done, "fetch")["attempts"]) == 1
    assert sorted(r.path for r in target.received) == sorted(f"/r/{p}" for p in HOSTILE_REPLIES)


@pytest.mark.parametrize(
    ("step", "path"),
    [
        (
            {"id": "a", "type": "transform", "output": 1, "depends_on": None},
            "$.steps[0].depends_on",
        ),
        ({"id": ["a"], "type": "transform", "output": 1}, "$.steps[0].id"),
        ({"id": {"a": 1}, "type": "transform", "output": 1}, "$.steps[0].id"),
    ],
    ids=["depends-on-null", "id-array", "id-object"],
)
def test_wrongly_typed_fields_are_422_not_500(
    open_client: Any, step: dict[str, Any], path: str
) -> None:
    """Found by schemathesis: these raised TypeError inside the validator."""
    definition = {**OPEN, "steps": [step]}
    body = assert_problem(
        open_client.post("/api/v1/workflows/typed/versions", json=definition), 422
    )
    assert path in [e["path"] for e in body["errors"]]


@pytest.mark.parametrize("outcome", [{}, [], {"a": 1}, None, 1])
def test_resolve_with_a_non_string_outcome_is_422(open_client: Any, outcome: Any) -> None:
    """Found by schemathesis: an object as outcome was unhashable in a set lookup."""
    eid = open_client.post("/hooks/open", json={"x": 1}).get_json()["execution_id"]
    path = f"/api/v1/executions/{eid}/steps/shape/resolve"
    assert_problem(open_client.post(path, json={"outcome": outcome}), 422)
