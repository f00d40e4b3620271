"""`flowforge replay ID --from-step S --onto V` and `flowforge replay-bulk`
(docs/contract.md#replay): remote through a real bin/api and bin/worker, previewed without --yes,
and on the box."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg

from tests.integration.test_api_keys import cli
from tests.integration.test_cli_remote import ok, remote
from tests.support.api import Api
from tests.support.definitions import unsigned
from tests.support.processes import Process

MARK = {"id": "mark", "type": "transform", "output": {"n": "{{ input.n }}"}}
BROKEN = {"id": "shape", "type": "transform", "depends_on": ["mark"], "output": "{{ mark.no.x }}"}
FIXED = {**BROKEN, "output": {"n": "{{ mark.n }}"}}


def test_replay_and_bulk_replay_from_the_cli(
    api: str,
    api_key: str,
    database_url: str,
    db: psycopg.Connection,
    workers: Callable[..., Process],
) -> None:
    client = Api(api, api_key)
    client.publish("fix", unsigned([MARK, BROKEN]))
    workers()
    ids = [client.start("fix", {"n": n}) for n in range(4)]
    for eid in ids:
        assert client.wait(eid)["status"] == "failed"
    client.publish("fix", unsigned([MARK, FIXED]))

    out = json.loads(
        ok(remote(api, api_key, "replay", ids[0], "--from-step", "shape", "--output", "json"))
    )
    assert out["replay_of"] == ids[0] and out["version"] == 2
    assert client.wait(out["execution_id"])["status"] == "succeeded"

    # Every failed execution of version 1 of `fix`, replayed from its step `shape`.
    bulk = ("replay-bulk", "--workflow", "fix", "--from-step", "shape", "--of-version", "1")
    preview = ok(remote(api, api_key, *bulk, "--status", "failed"))
    assert "3 executions would be replayed (confirm with --yes)" in preview
    assert db.execute("SELECT count(*) FROM executions WHERE replay_of IS NOT NULL").fetchone() == (
        1,
    )
    done = ok(remote(api, api_key, *bulk, "--batch", "2", "--yes"))
    assert "3 executions replayed, 0 refused" in done
    # On the box: nothing is left to take; the actor is cli@host.
    left = ok(cli(database_url, *bulk, "--yes"))
    assert "0 executions would be replayed" in left
    made = json.loads(
        ok(
            cli(
                database_url,
                "replay",
                ids[1],
                "--from-step",
                "mark",
                "--onto",
                "2",
                "--output",
                "json",
            )
        )
    )
    assert made["replay_of"] == ids[1]
    actors = db.execute(
        "SELECT detail->'actor'->>'kind', count(*) FROM execution_events "
        "WHERE kind = 'execution.replayed' GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert actors == [("api_key", 4), ("cli", 1)]
