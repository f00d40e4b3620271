"""Open approvals (docs/contract.md#approvals): wait steps with a form that are waiting,
their timeout not passed, for the console's list and `GET /api/v1/approvals`.

Read only when someone asks for the list: a workflow without forms pays nothing. The
statement walks the partial index of waiting steps (`steps_waiting`, sql/0001), keeps
the wait steps whose version's definition gives the step a `form`, and, for an assignee,
those that name them or name nobody (any operator); newest deadline last.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from flowforge.domain.model import StepStatus, StepType
from flowforge.store.runs import definition_for

# At most this many open approvals in one list, soonest to expire first.
MAX_LISTED = 200

OPEN_APPROVALS = f"""
SELECT s.execution_id::text AS execution_id, s.step_id AS step, w.key AS workflow,
       v.version, e.version_id, s.started_at AS waiting_since, s.wake_at AS expires_at
FROM steps s
JOIN executions e ON e.id = s.execution_id
JOIN workflows w ON w.id = e.workflow_id
JOIN workflow_versions v ON v.id = e.version_id
WHERE s.status = '{StepStatus.WAITING.value}' AND s.type = '{StepType.WAIT.value}'
  AND s.wake_at > now() AND e.cancel_requested_at IS NULL
  AND (%(workflows)s::text[] IS NULL OR w.key = ANY(%(workflows)s::text[]))
  AND (%(execution_id)s::uuid IS NULL OR s.execution_id = %(execution_id)s::uuid)
  AND EXISTS (
      SELECT 1 FROM jsonb_array_elements(v.definition -> 'steps') AS d
      -- An object, as the parser has it: "form": null publishes as a plain wait.
      WHERE d ->> 'id' = s.step_id AND jsonb_typeof(d -> 'form') = 'object'
        AND (%(assignee)s::text IS NULL
             OR coalesce(jsonb_array_length(d -> 'assignees'), 0) = 0
             OR d -> 'assignees' ? %(assignee)s::text))
ORDER BY s.wake_at, s.execution_id, s.step_id
LIMIT %(limit)s
"""


def list_open(
    conn: psycopg.Connection,
    *,
    assignee: str | None,
    workflows: tuple[str, ...] | None,
    execution_id: str | None = None,
) -> list[dict[str, Any]]:
    """The open approvals `assignee` may decide (None: anyone's), of the workflows a key
    may read (None: all), each with its form and assignees from its version."""
    params = {
        "assignee": assignee,
        "workflows": list(workflows) if workflows is not None else None,
        "execution_id": execution_id,
        "limit": MAX_LISTED,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(OPEN_APPROVALS, params).fetchall()
    for row in rows:
        row["form"] = definition_for(conn, row.pop("version_id")).step(row["step"]).form
    # The statement keeps steps with a form; should it ever disagree with the parser, a
    # plain wait is left out rather than failing everyone's list.
    return [row for row in rows if row["form"] is not None]
