"""Failure groups (docs/contract.md#failure-groups): their upsert, a fragment of the unit of
work that records a failure (runs.SAVE_RUN_FAILING), and the operator's reads and status
changes.

A group is keyed by workflow, step and signature (flowforge/domain/failures.py). The
upsert counts the failure, moves `last_seen`, and reopens a resolved group; a new group or
a reopened one carries the opening transaction's id (`opened_xact`), which is how the
statement tells the caller, and sql/0063's trigger the notifier, that it opened: one alert
per opening, however many executions fail into it. An ignored group counts on, silently.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flowforge.domain.model import ExecutionStatus, FailureGroupStatus, sql_list
from flowforge.errors import NotFound

if TYPE_CHECKING:
    from flowforge.domain.failures import Failure

STATUSES = tuple(status.value for status in FailureGroupStatus)
# What an operator's action sets, by the action's name.
ACTION_STATUS = {
    "resolve": FailureGroupStatus.RESOLVED,
    "ignore": FailureGroupStatus.IGNORED,
    "reopen": FailureGroupStatus.OPEN,
}
# The executions a group's page shows.
SAMPLES = 10
# The executions of a group a replay or a retry acts on (and its `pending`): still failed or
# held for an operator, and not replayed yet.
ACTIONABLE = (ExecutionStatus.FAILED, ExecutionStatus.NEEDS_ATTENTION)
# `pending` is counted up to this many (read through executions_by_failure_group), so a list
# of groups costs at most this many rows a group however large a group grows.
PENDING_CAP = 10_000

# A CTE of runs.SAVE_RUN_FAILING: the group counted (or created, or reopened) in the
# transaction that records the failure; the execution's UPDATE in the same statement links it.
UPSERT_CTE = """
failure_group AS (
    INSERT INTO failure_groups AS g (workflow_id, step_id, signature, outcome, status_class,
                                     code, kind, message, last_execution_id)
    SELECT workflow_id, %(fg_step)s, %(fg_signature)s, %(fg_outcome)s, %(fg_class)s,
           %(fg_code)s, %(fg_kind)s, %(fg_message)s, id
    FROM executions WHERE id = %(execution_id)s
    ON CONFLICT (workflow_id, step_id, signature) DO UPDATE SET
        count = g.count + 1, last_seen = now(), last_execution_id = excluded.last_execution_id,
        status = CASE WHEN g.status = 'resolved' THEN 'open' ELSE g.status END,
        opened_at = CASE WHEN g.status = 'resolved' THEN now() ELSE g.opened_at END,
        opened_xact = CASE WHEN g.status = 'resolved' THEN pg_current_xact_id()
                           ELSE g.opened_xact END
    RETURNING g.id, g.opened_xact = pg_current_xact_id() AS opened
)"""


def upsert_params(failure: Failure) -> dict[str, Any]:
    """The parameters of UPSERT_CTE for one failure."""
    sig = failure.signature
    return {
        "fg_step": failure.step_id,
        "fg_signature": sig.digest,
        "fg_outcome": sig.outcome,
        "fg_class": sig.status_class,
        "fg_code": sig.code,
        "fg_kind": sig.kind,
        "fg_message": sig.message,
    }


COLUMNS = f"""
g.id, w.key AS workflow, g.step_id AS step, g.outcome, g.status_class, g.code, g.kind,
g.message, g.status, g.count, g.first_seen, g.last_seen, g.opened_at, g.status_at,
g.status_by, g.last_execution_id::text AS last_execution_id,
(SELECT count(*) FROM (
     SELECT FROM executions e
     WHERE e.failure_group_id = g.id AND e.status IN {sql_list(ACTIONABLE)}
       AND NOT EXISTS (SELECT 1 FROM executions r WHERE r.replay_of = e.id)
     LIMIT {PENDING_CAP}) counted) AS pending
"""
LIST = f"""
SELECT {COLUMNS} FROM failure_groups g JOIN workflows w ON w.id = g.workflow_id
WHERE (%(workflow)s::text IS NULL OR w.key = %(workflow)s)
  AND (%(workflows)s::text[] IS NULL OR w.key = ANY(%(workflows)s))
  AND (%(status)s::text IS NULL OR g.status = %(status)s)
ORDER BY g.last_seen DESC, g.id DESC
LIMIT %(limit)s
"""
GET = f"""
SELECT {COLUMNS} FROM failure_groups g JOIN workflows w ON w.id = g.workflow_id WHERE g.id = %(id)s
"""
SAMPLE_EXECUTIONS = """
SELECT e.id::text AS id, e.status, e.created_at, e.finished_at, e.updated_at
FROM executions e WHERE e.failure_group_id = %(id)s
ORDER BY e.id DESC LIMIT %(limit)s
"""
SET_STATUS = """
UPDATE failure_groups SET status = %(status)s, status_at = now(), status_by = %(actor)s
WHERE id = %(id)s RETURNING id
"""
# A group's executions an action takes, oldest first, after a cursor: still failed or unknown
# and not replayed yet (as the failed inbox's bulk replay takes them), so a replay of the
# whole group twice replays each execution once.
MEMBERS = """
SELECT e.id::text FROM executions e
WHERE e.failure_group_id = %(id)s AND e.status = ANY(%(statuses)s)
  AND NOT EXISTS (SELECT 1 FROM executions r WHERE r.replay_of = e.id)
  AND (%(after)s::uuid IS NULL OR e.id > %(after)s)
ORDER BY e.id LIMIT %(limit)s
"""


def list_groups(
    conn: psycopg.Connection,
    *,
    workflow: str | None = None,
    status: str | None = None,
    workflows: tuple[str, ...] | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Groups, the most recently seen first; `workflows` is the key's scope (None: all).
    The caller checks the filter (api/failures.py)."""
    params = {
        "workflow": workflow,
        "status": status,
        "workflows": sorted(workflows) if workflows is not None else None,
        "limit": limit,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        return [_view(row) for row in cur.execute(LIST, params).fetchall()]


def get(conn: psycopg.Connection, group_id: int, *, samples: int = SAMPLES) -> dict[str, Any]:
    """One group with its newest executions; NotFound if there is none."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(GET, {"id": group_id}).fetchone()
        if row is None:
            raise NotFound("no such failure group")
        group = _view(row)
        if samples:
            rows = cur.execute(SAMPLE_EXECUTIONS, {"id": group_id, "limit": samples}).fetchall()
            group["executions"] = [_view(r) for r in rows]
    return group


def set_status(
    conn: psycopg.Connection, group_id: int, action: str, *, actor: dict[str, Any]
) -> dict[str, Any]:
    """Resolve, ignore or reopen a group (an operator's reopen alerts nobody: only a
    recurrence of a resolved group does)."""
    params = {"id": group_id, "status": ACTION_STATUS[action].value, "actor": Jsonb(actor)}
    with conn.transaction():
        if conn.execute(SET_STATUS, params).fetchone() is None:
            raise NotFound("no such failure group")
    return get(conn, group_id, samples=0)


def members(conn: psycopg.Connection, group_id: int, *, after: str | None, limit: int) -> list[str]:
    """The ids of a group's executions still failed or held for an operator and not replayed
    yet, oldest first."""
    statuses = [status.value for status in ACTIONABLE]
    params = {"id": group_id, "statuses": statuses, "after": after, "limit": limit}
    return [row[0] for row in conn.execute(MEMBERS, params)]


def _view(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the API answers it: counts as numbers, instants in ISO 8601."""
    return {
        k: v.isoformat() if isinstance(v, datetime) else int(v) if k in ("count", "pending") else v
        for k, v in row.items()
    }
