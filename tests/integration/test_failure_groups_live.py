"""Failure groups on the real processes (docs/contract.md#failure-groups): executions failed
by a real bin/worker are grouped; `flowforge failures` (remote, through a real bin/api)
lists, resolves and replays a group; the same failure after a resolve reopens it; a
replay of the whole group onto the fixed version succeeds."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg

from tests.integration.test_cli_remote import ok, remote
from tests.support.api import Api
from tests.support.definitions import unsigned
from tests.support.processes import Process

MARK = {"id": "mark", "type": "transform", "output": {"n": "{{ input.n }}"}}
BROKEN = {"id": "shape", "type": "transform", "depends_on": ["mark"], "output": "{{ mark.no.x }}"}
FIXED = {**BROKEN, "output": {"n": "{{ mark.n }}"}}


def _groups(api: str, api_key: str) -> list[dict]:
    out = ok(remote(api, api_key, "failures", "groups", "--workflow", "live", "--output", "json"))
    return list(json.loads(out)["groups"])


def test_failures_are_grouped_resolved_reopened_and_replayed_whole(
    api: str, api_key: str, client: Api, workers: Callable[..., Process], db: psycopg.Connection
) -> None:
    client.publish("live", unsigned([MARK, BROKEN]))
    workers()
    first = [client.start("live", {"n": n}) for n in range(3)]
    for eid in first:
        client.wait(eid, "failed", timeout=60)
    (group,) = _groups(api, api_key)
    assert (group["step"], group["count"], group["status"]) == ("shape", 3, "open")
    gid = str(group["id"])

    assert "resolved" in ok(remote(api, api_key, "failures", "resolve", gid))
    client.wait(client.start("live", {"n": 3}), "failed", timeout=60)
    (group,) = client.session.get(f"{api}/api/v1/failure-groups", timeout=10).json()["groups"]
    assert (group["count"], group["status"], group["pending"]) == (4, "open", 4)

    client.publish("live", unsigned([MARK, FIXED]))
    done = ok(remote(api, api_key, "failures", "replay", gid, "--yes"))
    assert "4 executions replayed, 0 refused" in done, done
    replays = [
        row[0]
        for row in db.execute(
            "SELECT id::text FROM executions WHERE replay_of IS NOT NULL"
        ).fetchall()
    ]
    assert len(replays) == 4
    for eid in replays:
        assert client.wait(eid, timeout=60)["status"] == "succeeded"
    shown = client.session.get(f"{api}/api/v1/failure-groups/{gid}", timeout=10).json()
    assert len(shown["executions"]) == 4 and shown["count"] == 4
