"""A webhook is checked against the input_schema of the workflow's newest version on every
API process, not the one a process cached (docs/reference/input-schema.md): each process
caches a workflow's intake target, and only the process that published forgets it. A body
the cached schema refused was answered 422 there without a look at the database — a
schema relaxed by a new version kept refusing what it now takes, on every other process,
for as long as the cache kept the old one (senders do not retry a 4xx: the events are
lost). Two real bin/api processes on one database."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.api import Api
from tests.support.processes import Process, start_api


def definition(n_type: Any) -> dict[str, Any]:
    return {
        "name": "typed",
        "trigger": {"webhook": {"auth": "none"}},
        "input_schema": {"properties": {"n": {"type": n_type}}},
        "steps": [{"id": "keep", "type": "transform", "output": {"n": 1}}],
    }


def hook(api: str, body: Any) -> requests.Response:
    return requests.post(
        f"{api}/hooks/typed",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": str(time.time_ns())},
        timeout=30,
    )


@pytest.fixture
def other_api(env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """A second bin/api, one process, on the same database."""
    proc, base = start_api(env, tmp_path / "other-api.log", workers=1)
    yield base
    proc.stop()


def test_a_relaxed_schema_takes_at_once_on_another_process(
    api: str, api_key: str, other_api: str, workers: Callable[..., Process]
) -> None:
    client = Api(api, api_key)
    client.publish("typed", definition("integer"))
    assert hook(other_api, {"n": 1}).status_code == 202  # the other process caches v1
    assert hook(other_api, {"n": "seven"}).status_code == 422

    client.publish("typed", definition(["integer", "string"]))
    r = hook(other_api, {"n": "seven"})
    assert r.status_code == 202, r.text
    workers()
    done = client.wait(r.json()["execution_id"], "succeeded")
    assert done["version"] == 2

    # Tightened again: what version 2 took is refused at once too.
    client.publish("typed", definition("integer"))
    assert hook(other_api, {"n": "eight"}).status_code == 422
    assert hook(other_api, {"n": 8}).status_code == 202


def test_a_source_routes_by_the_subscribers_newest_schema_on_another_process(
    api: str, api_key: str, other_api: str
) -> None:
    client = Api(api, api_key)
    client.publish("typed", definition("integer"))
    saved = client.session.post(
        f"{api}/api/v1/sources/feed",
        json={"auth": "none", "subscriptions": [{"workflow": "typed"}]},
        timeout=10,
    )
    assert saved.status_code == 200, saved.text

    def send(body: Any) -> requests.Response:
        return requests.post(
            f"{other_api}/hooks/feed",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Idempotency-Key": str(time.time_ns())},
            timeout=30,
        )

    assert send({"n": 1}).status_code == 202  # the other process caches typed's v1
    assert send({"n": "seven"}).status_code == 422
    client.publish("typed", definition(["integer", "string"]))
    r = send({"n": "seven"})
    assert r.status_code == 202, r.text
    assert len(r.json()["executions"]) == 1
