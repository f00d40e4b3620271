"""`flowforge cancel-bulk` and `flowforge retry-bulk`: by filter, through a real bin/api
and on the box; a preview count without --yes (a script is never asked), each execution
acted on with the key or cli@host as its actor, and no filter at all is a usage error."""

from __future__ import annotations

import json

import psycopg

from tests.integration.test_api_keys import cli
from tests.integration.test_cli_remote import ok, remote
from tests.support.api import Api
from tests.support.definitions import unsigned

NAP = unsigned([{"id": "nap", "type": "delay", "duration_s": 3600}])


def _statuses(db: psycopg.Connection, workflow: str) -> list[tuple[str, int]]:
    return db.execute(
        "SELECT e.status, count(*)::int FROM executions e JOIN workflows w "
        "ON w.id = e.workflow_id WHERE w.key = %s GROUP BY 1 ORDER BY 1",
        (workflow,),
    ).fetchall()


def test_bulk_cancel_and_retry_by_filter(
    api: str, api_key: str, database_url: str, db: psycopg.Connection
) -> None:
    client = Api(api, api_key)
    client.publish("naps", NAP)
    client.publish("other", NAP)
    ids = [client.start("naps", {"n": n}) for n in range(3)]
    client.start("other", {})

    preview = ok(remote(api, api_key, "cancel-bulk", "--workflow", "naps", "--since", "1h"))
    assert preview.strip() == "3 executions would be cancelled (confirm with --yes)"
    assert _statuses(db, "naps") == [("queued", 3)]
    listed = json.loads(
        ok(remote(api, api_key, "cancel-bulk", "--workflow", "naps", "--output", "json"))
    )
    assert listed["dry_run"] and sorted(listed["ids"]) == sorted(ids)

    done = ok(remote(api, api_key, "cancel-bulk", "--workflow", "naps", "--yes"))
    assert done.strip() == "3 executions cancelled, 0 skipped"
    assert _statuses(db, "naps") == [("cancelled", 3)]
    assert _statuses(db, "other") == [("queued", 1)]  # outside the filter
    actors = db.execute(
        "SELECT DISTINCT detail->'actor'->>'name' FROM execution_events "
        "WHERE kind = 'execution.cancel_requested' OR detail ? 'actor'"
    ).fetchall()
    assert actors == [("tests",)]

    # Nothing left to cancel: nothing asked.
    again = ok(remote(api, api_key, "cancel-bulk", "--workflow", "naps", "--yes"))
    assert again.strip() == "0 executions would be cancelled"

    # On the box, retry the cancelled ones: they run again (queued for a worker).
    out = cli(database_url, "retry-bulk", "--status", "cancelled", "--workflow", "naps", "--yes")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3 executions retried, 0 skipped"
    assert ("cancelled", 3) not in _statuses(db, "naps")
    by = db.execute(
        "SELECT DISTINCT detail->'actor'->>'name' FROM execution_events "
        "WHERE kind = 'execution.retried'"
    ).fetchall()
    assert len(by) == 1 and by[0][0].startswith("cli@")

    # Every execution is not a default: no filter is a usage error (exit 2), one line.
    refused = remote(api, api_key, "cancel-bulk", "--yes")
    assert refused.returncode == 2 and "name what to cancel" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
