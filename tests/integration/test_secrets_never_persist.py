"""`{{ secrets.NAME }}` reaches the remote server and nothing else: not the database (a full
pg_dump is searched), not the API's answers, not the logs of bin/api or bin/worker — even
when the server echoes the secret back in its body and headers."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from tests.support.api import Api, step
from tests.support.definitions import unsigned
from tests.support.processes import Process
from tests.support.target import Received, Reply, Target

REDACTED = "[redacted]"


def definition(target: Target) -> dict[str, Any]:
    """A secret in the URL, two headers and the JSON body; a transform copies the response."""
    return unsigned(
        [
            {
                "id": "call",
                "type": "http_request",
                "request": {
                    "method": "POST",
                    "url": f"{target.url}/echo/{{{{ input.order }}}}?key={{{{ secrets.token }}}}",
                    "headers": {
                        "Authorization": "Bearer {{ secrets.token }}",
                        "X-Api-Token": "{{ secrets.token }}",
                    },
                    "json": {"token": "{{ secrets.token }}", "order": "{{ input.order }}"},
                    "idempotency_key": "{{ execution.id }}-call",
                },
                "retry": {"max_attempts": 1},
            },
            {
                "id": "shape",
                "type": "transform",
                "depends_on": ["call"],
                "output": {"echoed": "{{ call.body }}", "where": "{{ call.headers.location }}"},
            },
        ],
        name="Uses a secret",
    )


def echo(request: Received) -> Reply:
    """A careless server: it repeats everything it was sent, secrets included."""
    token = request.headers.get("x-api-token", "")
    return Reply(
        json={
            "path": request.path,
            "headers": request.headers,
            "body": request.body.decode(),
            "nested": {"list": [token, f"prefix-{token}-suffix"]},
        },
        headers={"Location": f"/next?token={token}", "X-Request-Id": token},
    )


def pg_dump(database_url: str) -> str:
    """Everything PostgreSQL holds for this test database, as text."""
    return subprocess.run(
        ["pg_dump", "-d", database_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


# The secret `token` is usable by the workflow `uses-secret` only.
BOUND = {"FLOWFORGE_SECRET_TOKEN_WORKFLOWS": "uses-secret"}


def with_env(value: str, _tmp: Path) -> dict[str, str]:
    return {"FLOWFORGE_SECRET_TOKEN": value, **BOUND}


def with_credentials(value: str, tmp: Path) -> dict[str, str]:
    """systemd's LoadCredential= puts one file per credential in $CREDENTIALS_DIRECTORY."""
    directory = tmp / "credentials"
    directory.mkdir()
    (directory / "token").write_text(value + "\n", encoding="utf-8")
    (directory / "token").chmod(0o400)
    return {"CREDENTIALS_DIRECTORY": str(directory), **BOUND}


@pytest.mark.parametrize("source", [with_env, with_credentials], ids=["env", "credentials"])
def test_secret_reaches_the_target_and_is_stored_nowhere(
    client: Api,
    workers: Callable[..., Process],
    target: Target,
    database_url: str,
    tmp_path: Path,
    source: Callable[[str, Path], dict[str, str]],
) -> None:
    value = "tok" + secrets.token_hex(16)
    target.script = echo
    worker = workers(FLOWFORGE_LOG_LEVEL="DEBUG", **source(value, tmp_path))
    client.publish("uses-secret", definition(target))

    accepted = client.hook("uses-secret", {"order": "A1"})
    assert accepted.status_code == 202
    done = client.wait(accepted.json()["execution_id"])
    assert done["status"] == "succeeded", done

    # The target got the real value everywhere the templates put it.
    [seen] = target.received
    assert seen.path == f"/echo/A1?key={value}"
    assert seen.headers["authorization"] == f"Bearer {value}"
    assert seen.headers["x-api-token"] == value
    assert seen.json() == {"token": value, "order": "A1"}

    # What was stored is the echo with the value redacted, structure intact.
    output = step(done, "call")["output"]
    assert output["body"]["headers"]["x-api-token"] == REDACTED
    assert output["body"]["headers"]["authorization"] == f"Bearer {REDACTED}"
    assert output["body"]["nested"]["list"] == [REDACTED, f"prefix-{REDACTED}-suffix"]
    assert output["headers"]["x-request-id"] == REDACTED
    assert step(done, "shape")["output"]["where"] == f"/next?token={REDACTED}"
    # So is what the attempt recorded it sent, and what came back to it.
    [attempt] = step(done, "call")["attempts"]
    assert attempt["request"]["url"].endswith(f"/echo/A1?key={REDACTED}")
    assert attempt["request"]["headers"]["Authorization"] == f"Bearer {REDACTED}"
    assert attempt["request"]["headers"]["X-Api-Token"] == REDACTED
    assert f'"token":"{REDACTED}"' in attempt["request"]["body"]
    assert attempt["response"]["headers"]["x-request-id"] == REDACTED
    assert f'"x-api-token": "{REDACTED}"' in attempt["response"]["body"]

    # Search every place the value could have ended up.
    answers = [
        accepted.text,
        client.text(f"/api/v1/executions/{done['id']}"),
        client.text("/api/v1/executions"),
        client.text("/api/v1/workflows/uses-secret/versions/1"),
    ]
    dump = pg_dump(database_url)
    places = {
        "API answers": "\n".join(answers),
        "worker log": worker.log(),
        "API log": (tmp_path / "api.log").read_text(errors="replace"),
        "pg_dump": dump,
    }
    for where, text in places.items():
        assert value not in text, f"the secret leaked into the {where}"
    # The searches were over the real thing: the dump holds the redacted echo and the input.
    assert REDACTED in dump and '"order": "A1"' in dump
    assert "sending request" in places["worker log"]


def test_missing_secret_fails_the_step_and_sends_nothing(
    api: str, api_key: str, workers: Callable[..., Process], target: Target
) -> None:
    workers(**BOUND)
    client = Api(api, api_key)
    client.publish("uses-secret", definition(target))
    done = client.wait(client.start("uses-secret", {"order": "A1"}))
    assert done["status"] == "failed", done
    call = step(done, "call")
    assert call["status"] == "failed"
    assert "secret 'token' is not configured" in call["error"]
    assert "FLOWFORGE_SECRET_TOKEN" in call["error"]
    [attempt] = call["attempts"]
    assert attempt["outcome"] == "failed" and attempt["http_status"] is None
    assert step(done, "shape")["status"] == "cancelled"
    assert target.received == []


def test_secret_in_a_transform_is_refused_at_publish(api: str, api_key: str) -> None:
    """Transform outputs are stored, so secrets may not be read there at all."""
    bad = {
        "name": "Leaky",
        "steps": [{"id": "t", "type": "transform", "output": {"x": "{{ secrets.token }}"}}],
    }
    r = requests.post(
        f"{api}/api/v1/workflows/leaky/versions",
        json=bad,
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=10,
    )
    assert r.status_code == 422
    assert r.json()["errors"][0]["path"] == "$.steps[0].output.x"


def escaping_echo(request: Received) -> Reply:
    """Echo servers escape what they repeat: PHP writes '/' as '\\/', others use \\uXXXX."""
    token = request.headers.get("x-api-token", "")
    php = json.dumps({"token": token, "path": request.path}).replace("/", "\\/")
    unicode = "".join(f"\\u{ord(c):04x}" for c in token)
    body = php[:-1] + f', "escaped": "{unicode}", "list": ["{unicode}"]' + "}"
    location = f"/next?token={quote(token, safe='')}"
    return Reply(
        body=body.encode(), headers={"Content-Type": "application/json", "Location": location}
    )


def test_secrets_echoed_in_escaped_or_encoded_form_are_redacted(
    client: Api,
    workers: Callable[..., Process],
    target: Target,
    database_url: str,
    tmp_path: Path,
) -> None:
    """Real tokens hold '/', '+' and '=': the URL carries them %-encoded, JSON may escape them."""
    value = "tok/" + secrets.token_hex(12) + "+x=="
    target.script = escaping_echo
    worker = workers(FLOWFORGE_SECRET_TOKEN=value, **BOUND)
    client.publish("uses-secret", definition(target))
    done = client.wait(client.start("uses-secret", {"order": "A1"}))
    assert done["status"] == "succeeded", [(s["id"], s["error"]) for s in done["steps"]]
    [seen] = target.received
    assert seen.headers["x-api-token"] == value
    assert seen.path == f"/echo/A1?key={quote(value, safe='')}"

    body = step(done, "call")["output"]["body"]
    assert body == {
        "token": REDACTED,
        "path": f"/echo/A1?key={REDACTED}",
        "escaped": REDACTED,
        "list": [REDACTED],
    }
    assert step(done, "shape")["output"]["where"] == f"/next?token={REDACTED}"
    spellings = {value, quote(value, safe=""), value.replace("/", "\\/"), value[4:]}
    text = "\n".join(
        [
            client.text(f"/api/v1/executions/{done['id']}"),
            worker.log(),
            (tmp_path / "api.log").read_text(errors="replace"),
            pg_dump(database_url),
        ]
    )
    for spelling in spellings:
        assert spelling not in text, spelling
