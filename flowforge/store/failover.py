"""After an asynchronous failover: what the old primary recorded that the new one lacks.

With asynchronous replication the last commits before the primary's loss may never have
reached the standby. A webhook acknowledged with 202 may then have no execution on the
new primary, and an http_request attempt may have left (its request reached the target)
for an execution the new primary no longer knows, or knows at an earlier step. When the
old primary can still be started — alone, on a port no FlowForge process uses — this
report lists both, for an operator to replay the webhooks (their senders' ids are in the
report) and to check the targets of the attempts. An attempt counts as missing when the
new primary lacks it (its claim never arrived: the step may be claimed again, under the
same fencing token) or lacks the outcome the old one recorded (the step will be recovered
and may be repeated); attempts are matched by their identity, which no failover
re-issues:

    python -m flowforge.store.failover --old postgresql://old-host/flowforge \\
        --new postgresql://new-host/flowforge [--since-minutes 60]

It only reads. Exit status 0 when nothing is missing, 1 when something is.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import psycopg

from flowforge.errors import DatabaseError, DatabaseUnavailable
from flowforge.store.db import conninfo, wrap_exceptions

# What the old primary wrote in the window, keyed the way the new one can be asked.
OLD_EXECUTIONS = """
SELECT e.id::text, w.key, e.idempotency_key, e.created_at
FROM executions e JOIN workflows w ON w.id = e.workflow_id
WHERE e.updated_at >= now() - make_interval(mins => %(minutes)s)
   OR e.created_at >= now() - make_interval(mins => %(minutes)s)
"""
OLD_ATTEMPTS = """
SELECT a.execution_id::text, a.step_id, a.fencing_token, a.identity::text, a.started_at,
       a.outcome, s.type, a.http_status
FROM attempts a JOIN steps s ON s.execution_id = a.execution_id AND s.step_id = a.step_id
WHERE a.started_at >= now() - make_interval(mins => %(minutes)s)
"""
NEW_EXECUTIONS = "SELECT id::text FROM executions WHERE id = ANY(%(ids)s::uuid[])"
NEW_ATTEMPTS = """
SELECT execution_id::text, step_id, fencing_token, identity::text, started_at, outcome
FROM attempts WHERE execution_id = ANY(%(ids)s::uuid[])
"""


def _identity(eid: str, sid: str, token: int, ident: str | None, started: Any) -> tuple[Any, ...]:
    """What names one attempt on every timeline: its uuid (migration 0047). The fencing
    token alone does not: a claim the standby never received is re-issued, same token,
    by the promoted primary. Rows older than 0047 fall back to token and start time."""
    return (ident,) if ident is not None else (eid, sid, token, started)


def report(old_url: str, new_url: str, minutes: int) -> dict[str, list[dict[str, Any]]]:
    """Executions and attempts of the last `minutes` on the old primary that the new one
    lacks, or knows without the outcome the old one recorded."""
    params = {"minutes": minutes}
    with psycopg.connect(conninfo(old_url), autocommit=True) as old:
        executions = old.execute(OLD_EXECUTIONS, params).fetchall()
        attempts = old.execute(OLD_ATTEMPTS, params).fetchall()
    ids = sorted({row[0] for row in executions} | {row[0] for row in attempts})
    with psycopg.connect(conninfo(new_url), autocommit=True) as new:
        known = {row[0] for row in new.execute(NEW_EXECUTIONS, {"ids": ids})}
        outcomes = {_identity(*row[:5]): row[5] for row in new.execute(NEW_ATTEMPTS, {"ids": ids})}
    missing = []
    for eid, sid, token, ident, at, outcome, kind, status in attempts:
        key = _identity(eid, sid, token, ident, at)
        if key not in outcomes:
            lost = "attempt"  # the new primary may claim the step again: a second send
        elif outcome is not None and outcomes[key] != outcome:
            # The new primary recovers the step (lost_lease or unknown) and may repeat it.
            lost = "outcome"
        else:
            continue
        missing.append(
            {
                "execution_id": eid,
                "step_id": sid,
                "fencing_token": token,
                "attempt_identity": ident,
                "lost": lost,
                "outcome_on_old": outcome,
                "type": kind,
                "started_at": str(at),
                "http_status": status,
                "request_may_have_left": kind == "http_request",
            }
        )
    return {
        "missing_executions": [
            {"execution_id": eid, "workflow": key, "idempotency_key": idem, "created_at": str(at)}
            for eid, key, idem, at in executions
            if eid not in known
        ],
        "missing_attempts": missing,
    }


def main(argv: list[str] | None = None) -> int:
    """Print the report as JSON."""
    parser = argparse.ArgumentParser(prog="python -m flowforge.store.failover", description=__doc__)
    parser.add_argument("--old", required=True, help="the old primary, started alone")
    parser.add_argument("--new", required=True, help="the promoted primary")
    parser.add_argument("--since-minutes", type=int, default=60)
    args = parser.parse_args(argv)
    try:
        with wrap_exceptions(every_error=True):
            found = report(args.old, args.new, args.since_minutes)
    except (DatabaseUnavailable, DatabaseError) as exc:
        print(f"failover: {str(exc).strip()}", file=sys.stderr)
        return 2
    print(json.dumps(found, indent=2))
    return 1 if found["missing_executions"] or found["missing_attempts"] else 0


if __name__ == "__main__":
    sys.exit(main())
