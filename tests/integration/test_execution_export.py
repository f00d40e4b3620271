"""`flowforge executions export ID` (flowforge/steps/recording.py) and `flowforge test
--from FILE`: a real execution through bin/api and bin/worker becomes a fixture with no
secret in it — in none of the spellings the redaction tests use — and no resume token,
and replays offline with the same outcome; a newer definition says what differs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from flowforge.steps.http_step import redactor
from tests.faults.helpers import FLOWFORGE
from tests.integration.test_cli_remote import remote
from tests.support.api import Api
from tests.support.definitions import http, transform, unsigned, wait
from tests.support.processes import Process, wait_for
from tests.support.target import Received, Reply, Target
from tests.unit.test_redaction import ENCODINGS, NESTED_ENCODINGS

SECRET = "Sk_live&4/7<x>+y'z-0451"
SPELLINGS = {**ENCODINGS, **NESTED_ENCODINGS}


@pytest.fixture
def client(api: str, api_key: str, workers: Callable[..., Process]) -> Api:
    workers(
        FLOWFORGE_PUBLIC_URL=api,
        FLOWFORGE_SECRET_PARTNER=SECRET,
        FLOWFORGE_SECRET_PARTNER_WORKFLOWS="partner",
    )
    return Api(api, api_key)


def definition(target: Target) -> dict[str, Any]:
    return unsigned(
        [
            http(
                "call",
                "POST",
                f"{target.url}/orders",
                headers={"Authorization": "Bearer {{ secrets.partner }}"},
                json={"order": "{{ input.order }}", "resume": "{{ waits.approval.url }}"},
            ),
            wait("approval", 60, after=("call",)),
            transform(
                "done",
                {"order": "{{ input.order }}", "ok": "{{ approval.ok }}"},
                after=("approval",),
            ),
        ],
        name="Partner call, then an approval",
    )


def echo_every_spelling(request: Received) -> Reply:
    """A partner that echoes the secret it was sent, in every spelling at once."""
    return Reply(
        status=201,
        json={name: spell(SECRET) for name, spell in SPELLINGS.items()},
        headers={"X-Request-Id": SECRET},
    )


def test_an_export_holds_no_secret_and_replays_offline(
    tmp_path: Path, api: str, api_key: str, client: Api, target: Target
) -> None:
    target.script = echo_every_spelling
    document = definition(target)
    client.publish("partner", document)
    eid = client.start("partner", {"order": 17})
    sent = wait_for(lambda: target.requests_to("/orders"), message="the partner call")
    resume_url = sent[0].json()["resume"]
    token = resume_url.rsplit("/", 1)[1]
    client.wait(eid, "waiting")
    assert requests.post(resume_url, json={"ok": True}, timeout=10).status_code == 202
    assert client.wait(eid, "succeeded")["status"] == "succeeded"

    exported = tmp_path / "case.json"
    result = remote(api, api_key, "executions", "export", eid, "--file", str(exported))
    assert result.returncode == 0, result
    text = exported.read_text()
    for name, spell in SPELLINGS.items():
        assert spell(SECRET) not in text, name
    found = redactor([SECRET])
    assert found is not None and not found.reveals(text)
    assert token not in text
    fixture = json.loads(text)
    assert fixture["secrets"] == {"partner": "test-value-of-partner"}
    assert fixture["resumes"] == {"approval": {"ok": True}}

    definition_file = tmp_path / "partner.json"
    definition_file.write_text(json.dumps(document))
    replay = remote(api, api_key, "test", str(definition_file), "--from", str(exported))
    assert replay.returncode == 0, replay
    assert "1 passed, 0 failed" in replay.stdout

    document["steps"][2]["output"]["ok"] = "{{ input.order }}"
    definition_file.write_text(json.dumps(document))
    newer = remote(api, api_key, "test", str(definition_file), "--from", str(exported))
    assert newer.returncode == 1, newer
    assert "steps.done.output.ok: expected true, got 17" in newer.stdout
    assert FLOWFORGE  # the installed script ran each command
