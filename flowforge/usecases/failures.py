"""A failure group acted on whole (docs/contract.md#failure-groups): its executions that are
still failed or held for an operator replayed (usecases/replay.py) or retried
(usecases/actions.py), each in its own unit of work as one would be, one batch at a time.

A batch walks the group's executions oldest first after a cursor (`after`); one refused
(a replay whose upstream part differs, a retry that waits on an unknown step) is listed
with why and does not stop the others, and the cursor moves past it, so repeating the call
with `next_after` finishes the group.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from flowforge.domain import definitions
from flowforge.domain.model import MAX_PAGE
from flowforge.errors import ClientError, InvalidBody
from flowforge.store import failures
from flowforge.usecases import actions, replay


def is_uuid(text: str) -> bool:
    """Whether `text` is an execution id (a cursor)."""
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _page(conn: psycopg.Connection, group_id: int, after: str | None, limit: int) -> list[str]:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidBody(
            "Invalid batch",
            f"limit must be from 1 to {MAX_PAGE}",
            errors=[{"path": "$.limit", "message": "out of range"}],
        )
    failures.get(conn, group_id, samples=0)  # NotFound first
    return failures.members(conn, group_id, after=after, limit=limit)


def replay_step(group: dict[str, Any], from_step: str | None) -> str:
    """The step a group's replay starts from: the one asked, else the group's own step (a
    map item's row or an execution that failed without a step has none to offer)."""
    step = from_step if from_step is not None else group["step"]
    if not step or not definitions.is_step_id(step):
        raise InvalidBody(
            "Invalid replay",
            "this group names no step to replay from: give from_step",
            errors=[{"path": "$.from_step", "message": "a step id is required"}],
        )
    return str(step)


def replay_batch(
    conn: psycopg.Connection,
    group_id: int,
    *,
    from_step: str | None,
    version: int | None,
    after: str | None,
    limit: int,
    actor: dict[str, Any],
) -> dict[str, Any]:
    """Replay one batch of the group's executions onto `version` (None: the newest)."""
    group = failures.get(conn, group_id, samples=0)
    step = replay_step(group, from_step)
    ids = _page(conn, group_id, after, limit)
    done, refused = [], []
    for execution_id in ids:
        try:
            made = replay.replay(conn, execution_id, step, version, actor=actor)
        except ClientError as exc:
            refused.append({"execution_id": execution_id, "detail": exc.detail})
        else:
            done.append(made.execution_id)
    return {
        "replayed": done,
        "refused": refused,
        "next_after": ids[-1] if len(ids) == limit else None,
    }


def retry_batch(
    conn: psycopg.Connection,
    group_id: int,
    *,
    after: str | None,
    limit: int,
    actor: dict[str, Any],
) -> dict[str, Any]:
    """Retry one batch of the group's executions in place (actions.retry)."""
    ids = _page(conn, group_id, after, limit)
    done, refused = [], []
    for execution_id in ids:
        try:
            actions.retry(conn, execution_id, actor=actor)
        except ClientError as exc:
            refused.append({"execution_id": execution_id, "detail": exc.detail})
        else:
            done.append(execution_id)
    return {
        "retried": done,
        "refused": refused,
        "next_after": ids[-1] if len(ids) == limit else None,
    }
