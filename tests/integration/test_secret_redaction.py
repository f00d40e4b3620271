"""A real worker against a careless 127.0.0.1 server that echoes a secret back in every
spelling it can think of: the secret must not reach the API's answers, the worker's log,
attempts.error, the event history or a pg_dump in any of them — and FlowForge's own error
messages must not quote it either (a URL whose scheme is `{{ secrets.tok }}` once failed
with `scheme 'tok…' is not allowed`, lower-cased past the redactor)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from flowforge.steps.http_step import ATTEMPT_BODY_BYTES, redactor_reach
from tests.integration.test_secrets_never_persist import pg_dump
from tests.support.api import Api, step
from tests.support.definitions import unsigned
from tests.support.processes import Process
from tests.support.target import Received, Reply, Target

WORKFLOW = "echoes"
REDACTED = "[redacted]"


def spellings(value: str) -> dict[str, str]:
    """The forms a server may echo `value` in, each named for the failure message."""
    escaped = "".join(f"\\u{ord(c):04x}" for c in value)
    return {
        "upper case": value.upper(),
        "lower case": value.lower(),
        "\\u escapes": escaped,
        "\\U escapes upper hex": "".join(f"\\u{ord(c):04X}" for c in value),
        "%-encoding, lower hex": "".join(f"%{b:02x}" for b in value.encode()),
        "%-encoding, upper hex": "".join(f"%{b:02X}" for b in value.encode()),
        "%-encoding of unsafe characters": quote(value, safe="").lower(),
        "JSON in a JSON string": json.dumps(json.dumps({"t": escaped}))[1:-1],
        "mixed": escaped[:12] + value[2:].swapcase(),
    }


def careless(request: Received) -> Reply:
    """Repeats the token it was sent, in every spelling, in several kinds of body."""
    token = request.headers.get("x-api-token", "")
    forms = spellings(token)
    if request.path.startswith("/plain"):
        text = "\n".join(f"{name}: {form}" for name, form in forms.items())
        return Reply(body=text.encode(), headers={"Content-Type": "text/plain"})
    if request.path.startswith("/truncated"):
        # Too long to keep whole, so it is stored as (cut) text, never parsed.
        body = json.dumps({"forms": list(forms.values()), "pad": "x" * 300_000})
        return Reply(
            body=body.encode(), headers={"Content-Type": "application/json", "X-Request-Id": token}
        )
    inner = json.dumps({"forms": list(forms.values())})
    return Reply(
        json={"inner": inner, "forms": forms, "swapped": token.swapcase()},
        headers={"Location": f"/next?t={forms['%-encoding, lower hex']}"},
    )


def call(step_id: str, url: str) -> dict[str, Any]:
    return {
        "id": step_id,
        "type": "http_request",
        "request": {"method": "GET", "url": url, "headers": {"X-Api-Token": "{{ secrets.tok }}"}},
        "retry": {"max_attempts": 1},
    }


def definition(target: Target) -> dict[str, Any]:
    return unsigned(
        [
            call("plain", f"{target.url}/plain"),
            call("truncated", f"{target.url}/truncated"),
            call("json", f"{target.url}/json"),
            # A secret as the scheme: refused before any socket, and the message must not
            # quote it (urlsplit lower-cases schemes, which hid it from the redactor).
            call("scheme", f"{{{{ secrets.scheme }}}}://127.0.0.1:{target.port}/x"),
        ],
        name="Echoes secrets",
    )


@pytest.fixture
def value() -> str:
    # Mixed case, with the characters real tokens carry ('/', '+', '=').
    return "Tok/" + secrets.token_hex(8).upper() + "+Ab=" + secrets.token_hex(8)


def test_secrets_echoed_in_any_spelling_are_stored_nowhere(
    client: Api,
    workers: Callable[..., Process],
    target: Target,
    database_url: str,
    tmp_path: Path,
    value: str,
) -> None:
    target.script = careless
    scheme_value = "SuperSecret" + secrets.token_hex(8)  # a valid URL scheme
    worker = workers(
        FLOWFORGE_SECRET_TOK=value,
        FLOWFORGE_SECRET_TOK_WORKFLOWS=WORKFLOW,
        FLOWFORGE_SECRET_SCHEME=scheme_value,
        FLOWFORGE_SECRET_SCHEME_WORKFLOWS=WORKFLOW,
    )
    client.publish(WORKFLOW, definition(target))
    done = client.wait(client.start(WORKFLOW, {"n": 1}))
    assert done["status"] == "failed", done
    for step_id in ("plain", "truncated", "json"):
        assert step(done, step_id)["status"] == "succeeded", step(done, step_id)
    assert len(target.received) == 3  # the scheme step sent nothing

    scheme = step(done, "scheme")
    assert scheme["status"] == "failed"
    assert "is not allowed" in scheme["error"], scheme["error"]

    plain = step(done, "plain")["output"]["body"]
    assert plain.count(REDACTED) == len(spellings(value)), plain
    truncated = step(done, "truncated")["output"]
    assert truncated["truncated"] and truncated["headers"]["x-request-id"] == REDACTED
    parsed = step(done, "json")["output"]
    assert parsed["body"]["swapped"] == REDACTED
    forms = parsed["body"]["forms"]
    assert forms.pop("JSON in a JSON string") == '{\\"t\\": \\"[redacted]\\"}'
    assert set(forms.values()) == {REDACTED}
    inner = json.loads(parsed["body"]["inner"])["forms"]
    assert inner.count(REDACTED) == len(spellings(value)) - 1
    # Each attempt's own record of the exchange holds no spelling either (searched below).
    for step_id in ("plain", "truncated", "json"):
        [attempt] = step(done, step_id)["attempts"]
        assert attempt["request"]["headers"]["X-Api-Token"] == REDACTED
        assert REDACTED in attempt["response"]["body"], attempt["response"]

    places = {
        "API answers": "\n".join(
            [
                client.text(f"/api/v1/executions/{done['id']}"),
                client.text("/api/v1/executions"),
            ]
        ),
        "worker log": worker.log(),
        "API log": (tmp_path / "api.log").read_text(errors="replace"),
        "pg_dump": pg_dump(database_url),
    }
    for where, text in places.items():
        for name, form in {"as sent": value, **spellings(value)}.items():
            assert form not in text, f"the secret ({name}) leaked into the {where}"
        assert value.lower() not in text.lower(), f"the secret leaked into the {where}"
        assert scheme_value.lower() not in text.lower(), f"the scheme leaked into the {where}"


RESPONSE_LIMIT = 262_144  # the worker keeps this many bytes of a response body


def percent_encoded(value: str) -> str:
    return "".join(f"%{b:02x}" for b in value.encode())


def straddling(request: Received) -> Reply:
    """Pads its answer so that the echoed token begins before a cut and ends past it: the
    response limit, or the end of what the worker reads to redact (its limit plus the
    longest spelling of its secret), behind long spellings that redaction shortens."""
    token = request.headers.get("x-api-token", "")
    case = request.path.rsplit("/", 1)[-1]
    form = percent_encoded(token) if case == "percent_encoded" else token
    before, cut = "", RESPONSE_LIMIT
    if case == "past_what_is_read":
        before = percent_encoded(token) * 200
        cut += redactor_reach([token])
    elif case == "attempt_preview":
        cut = ATTEMPT_BODY_BYTES  # where an attempt's own record of the answer is cut
    pad = "x" * (cut - len(before) - len(form) // 2)
    body = before + pad + form + "y" * 5_000
    return Reply(body=body.encode(), headers={"Content-Type": "text/plain"})


def test_a_secret_a_cut_goes_through_is_redacted_whole(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    database_url: str,
    value: str,
) -> None:
    target.script = straddling
    workers(FLOWFORGE_SECRET_TOK=value, FLOWFORGE_SECRET_TOK_WORKFLOWS=WORKFLOW)
    client = Api(api, api_key)
    ends = {"as_sent": f"x{REDACTED}", "percent_encoded": f"x{REDACTED}", "past_what_is_read": "x"}
    client.publish(
        WORKFLOW,
        unsigned(
            [call(case, f"{target.url}/straddle/{case}") for case in [*ends, "attempt_preview"]],
            name="Cut",
        ),
    )
    done = client.wait(client.start(WORKFLOW, {"n": 1}))
    assert done["status"] == "succeeded", done
    preview = step(done, "attempt_preview")
    assert preview["attempts"][0]["response"]["truncated"] is True
    assert preview["attempts"][0]["response"]["body"].endswith(f"x{REDACTED}")
    assert preview["output"]["body"].endswith(f"x{REDACTED}" + "y" * 5_000)
    for case, end in ends.items():
        output = step(done, case)["output"]
        assert output["truncated"] is True
        body = output["body"]
        assert body.endswith(end), (case, body[-80:])
        assert len(body.encode()) <= RESPONSE_LIMIT + len(REDACTED)
    dump = pg_dump(database_url)
    for start in (value[:8], percent_encoded(value)[:12]):
        assert start not in dump, f"the start of the secret ({start!r}) was stored"
