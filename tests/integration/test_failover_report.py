"""python -m flowforge.store.failover lists what an old primary recorded that the promoted one
lacks (issue 26). Two private databases stand for the two servers: the same history, then
one execution and one attempt only the old one got (the commits replication lost)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import psycopg

from flowforge.domain.definitions import parse_definition
from flowforge.store.failover import report
from flowforge.usecases import intake
from flowforge.usecases.publishing import publish
from tests.support.definitions import OPEN
from tests.support.processes import ROOT


def _failover_cli(old: str, new: str) -> subprocess.CompletedProcess[str]:
    """`python -m flowforge.store.failover --old OLD --new NEW`, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "flowforge.store.failover", "--old", old, "--new", new],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def _webhook(conn: psycopg.Connection, key: str) -> str:
    target = intake.Targets().get(conn, "open", None)
    return intake.accept(conn, target, b'{"x": 1}', key, None).execution_id


def test_the_report_lists_the_executions_and_attempts_the_new_primary_lacks(
    database_url: str, new_database_url: str, pg_admin_url: str
) -> None:
    old_url, new_url = database_url, new_database_url
    with psycopg.connect(old_url, autocommit=True) as conn:
        publish(conn, "open", OPEN, parse_definition(OPEN), None)
        _webhook(conn, "both")
    # What replication had shipped: a copy of everything so far.
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        new_name = psycopg.conninfo.conninfo_to_dict(new_url)["dbname"]
        old_name = psycopg.conninfo.conninfo_to_dict(old_url)["dbname"]
        conn.execute(f'CREATE DATABASE "{new_name}" TEMPLATE "{old_name}"')
    with psycopg.connect(old_url, autocommit=True) as old:
        lost = _webhook(old, "only-old")
        old.execute(
            "INSERT INTO attempts (execution_id, step_id, attempt, fencing_token) "
            "VALUES (%(e)s, 'shape', 1, 7)",
            {"e": lost},
        )
    found = report(old_url, new_url, minutes=60)
    assert [e["execution_id"] for e in found["missing_executions"]] == [lost]
    assert found["missing_executions"][0]["idempotency_key"] == "only-old"
    assert [(a["execution_id"], a["fencing_token"]) for a in found["missing_attempts"]] == [
        (lost, 7)
    ]
    run = _failover_cli(old_url, new_url)
    assert run.returncode == 1 and lost in run.stdout
    same = _failover_cli(new_url, new_url)
    assert same.returncode == 0, same.stdout


def _copy(pg_admin_url: str, old_url: str, new_url: str) -> None:
    """What replication had shipped: a copy of the old database so far."""
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        new_name = psycopg.conninfo.conninfo_to_dict(new_url)["dbname"]
        old_name = psycopg.conninfo.conninfo_to_dict(old_url)["dbname"]
        conn.execute(f'CREATE DATABASE "{new_name}" TEMPLATE "{old_name}"')


ATTEMPT = """
INSERT INTO attempts (execution_id, step_id, attempt, fencing_token, outcome, identity)
VALUES (%(e)s, 'shape', 1, %(token)s, %(outcome)s, %(identity)s)
"""


def test_a_reissued_token_and_a_lost_outcome_are_flagged_with_or_without_identities(
    database_url: str, new_database_url: str, pg_admin_url: str
) -> None:
    """Issue 42: the new primary re-issues a fencing token whose claim it never got, and
    knows attempts without the outcome the old one recorded. Rows written before
    migration 0047 have no identity and are matched by token and start time instead."""
    old_url, new_url = database_url, new_database_url
    with psycopg.connect(old_url, autocommit=True) as conn:
        publish(conn, "open", OPEN, parse_definition(OPEN), None)
        eid = _webhook(conn, "both")
        for token, identity in ((1, None), (2, str(uuid.uuid4()))):
            params = {"e": eid, "token": token, "outcome": None, "identity": identity}
            conn.execute(ATTEMPT, params)
    _copy(pg_admin_url, old_url, new_url)
    with psycopg.connect(old_url, autocommit=True) as old:
        # The outcomes, and a claim under token 3, only the old primary got.
        old.execute("UPDATE attempts SET outcome = 'succeeded' WHERE fencing_token IN (1, 2)")
        claim = {"e": eid, "token": 3, "outcome": "succeeded", "identity": str(uuid.uuid4())}
        old.execute(ATTEMPT, claim)
    with psycopg.connect(new_url, autocommit=True) as new:
        # The new primary claims again under the re-issued token 3 (later, its own start).
        new.execute(ATTEMPT, {"e": eid, "token": 3, "outcome": None, "identity": None})
    found = report(old_url, new_url, minutes=60)
    flagged = sorted((a["fencing_token"], a["lost"]) for a in found["missing_attempts"])
    assert flagged == [(1, "outcome"), (2, "outcome"), (3, "attempt")]
