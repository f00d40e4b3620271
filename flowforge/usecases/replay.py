"""Replay / fork an execution from a step onto a version (docs/contract.md#replay), one or in bulk.

A replay is a new execution of the same workflow and input, pinned to the target version
(its own or the newest), linked both ways (`replay_of` on the new one; the original's
`replayed_by` is read back through the index and recorded in its history). The steps
upstream of the chosen step — its ancestors in the target version — are written
`succeeded` (or `skipped`) with the outputs the original recorded, and no attempt: they
are never run or sent again. Everything else starts afresh on the target version.

Refused (409, one entry per path in `errors`) when the upstream part differs between the
two versions — a step missing, of another type, or with other dependencies — or when an
upstream step of the original has no recorded output: `unknown` (resolve it first) or
failed, cancelled, not run (replay from it, or from an earlier step).

A target version with `concurrency` gives the replay a slot at once or refuses it (409,
as an operator retry does); its `deadline_s` counts from the replay.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flowforge.domain import definitions
from flowforge.domain.definitions import Definition, asks_alike
from flowforge.domain.engine import DONE_STEP, Run
from flowforge.domain.model import (
    MAX_PAGE,
    EventKind,
    ExecutionStatus,
    StepStatus,
    execution_event,
)
from flowforge.errors import ClientError, Conflict, InvalidBody, NotFound
from flowforge.store import creation, failures, flowcontrol
from flowforge.store.runs import definition_for, load_run, save_run, unit_of_work
from flowforge.usecases import actions, intake
from flowforge.usecases.intake import uuid7

# The version a replay pins: a number, or the newest.
TARGET_VERSION = """
SELECT v.id, v.version FROM workflow_versions v JOIN workflows w ON w.id = v.workflow_id
WHERE w.id = %(workflow_id)s
  AND v.version = CASE WHEN %(version)s::int IS NULL THEN w.latest_version ELSE %(version)s END
"""
# The new execution's steps: upstream ones as the original recorded them, the rest pending.
CREATE_STEPS = """
INSERT INTO steps (execution_id, step_id, type, position, status, output, started_at,
                   finished_at, priority)
SELECT %(id)s, s.step_id, s.type, s.n, s.status, s.output, s.started_at, s.finished_at,
       %(priority)s
FROM ROWS FROM (jsonb_to_recordset(%(steps)s)
                AS (step_id text, type text, status text, output jsonb,
                    started_at timestamptz, finished_at timestamptz))
     WITH ORDINALITY AS s(step_id, type, status, output, started_at, finished_at, n)
"""
RECORD = """
INSERT INTO execution_events (execution_id, kind, detail)
VALUES (%(id)s, %(queued_kind)s, %(created)s), (%(original)s, %(replayed_kind)s, %(replayed)s)
"""
REPLAYED_BY = """
SELECT id::text FROM executions WHERE replay_of = %(id)s ORDER BY created_at, id
"""
# replay_of is kept as recorded when retention deletes the original (no foreign key on
# the hot executions table, migration 0002): whether it still exists is read with it.
REPLAY_OF = """
SELECT e.replay_of::text, e.replay_from,
       e.replay_of IS NOT NULL AND NOT EXISTS (SELECT 1 FROM executions o WHERE o.id = e.replay_of)
FROM executions e WHERE e.id = %(id)s
"""

# Bulk: a workflow's executions matching a filter, oldest first, not replayed yet, up to
# the newest one the preview saw (`upto`), after the last one of the previous batch.
SELECTION = """
FROM executions e
JOIN workflows w ON w.id = e.workflow_id
JOIN workflow_versions v ON v.id = e.version_id
WHERE w.key = %(workflow)s
  AND (%(version)s::int IS NULL OR v.version = %(version)s)
  AND (%(status)s::text IS NULL OR e.status = %(status)s)
  AND (%(since)s::timestamptz IS NULL OR e.created_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR e.created_at < %(until)s)
  AND ((%(error)s::text IS NULL AND %(step)s::text IS NULL) OR EXISTS (
      SELECT 1 FROM steps s WHERE s.execution_id = e.id
        AND (%(step)s::text IS NULL OR (s.step_id = %(step)s AND s.status = 'failed'))
        AND (%(error)s::text IS NULL OR strpos(lower(s.error), lower(%(error)s)) > 0)))
  AND NOT EXISTS (SELECT 1 FROM executions r WHERE r.replay_of = e.id)
  AND (%(attr_names)s::text[] IS NULL OR e.id IN (
      SELECT a.execution_id FROM execution_attributes a
      JOIN unnest(%(attr_names)s::text[], %(attr_values)s::text[]) AS f(name, value)
        ON a.name = f.name AND a.value = f.value
      GROUP BY a.execution_id HAVING count(*) = cardinality(%(attr_names)s::text[])))
  AND (%(upto)s::uuid IS NULL OR e.id <= %(upto)s)
  AND (%(after)s::uuid IS NULL OR e.id > %(after)s)
"""
PREVIEW = f"SELECT count(*), max(e.id::text) {SELECTION}"  # (uuid has no max; its text sorts alike)
BATCH = f"SELECT e.id::text {SELECTION} ORDER BY e.id LIMIT %(limit)s"
# Executions a replay may start from: finished, or held for an operator.
REPLAYABLE = frozenset(
    {
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.FAILED,
        ExecutionStatus.CANCELLED,
        ExecutionStatus.NEEDS_ATTENTION,
        ExecutionStatus.PAUSED,
    }
)


class ReplayRefused(Conflict):
    """The replay cannot keep the upstream part as recorded; `errors` says where."""

    title = "Replay refused"

    def __init__(self, message: str, errors: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.errors = errors


class InvalidReplay(ClientError):
    """The replay request names no step of the target version, or an unusable filter."""

    status = 422
    title = "Invalid replay"

    def __init__(self, message: str, errors: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.errors = errors


def upstream_differences(
    original: Definition, target: Definition, from_step: str
) -> list[dict[str, str]]:
    """Where the part of `target` upstream of `from_step` (its ancestors, and the step's
    own dependencies) differs from `original`: ids, types, dependencies."""
    errors = []
    for step_id in sorted(target.ancestors(from_step)):
        path = f"$.steps.{step_id}"
        mine = target.step(step_id)
        if step_id not in {s.id for s in original.steps}:
            errors.append({"path": path, "message": "not in the original's version"})
            continue
        theirs = original.step(step_id)
        if theirs.type != mine.type:
            errors.append(
                {"path": f"{path}.type", "message": f"{theirs.type} there, {mine.type} here"}
            )
        if set(theirs.depends_on) != set(mine.depends_on):
            errors.append({"path": f"{path}.depends_on", "message": "other dependencies"})
        if not asks_alike(theirs.form, mine.form):
            # docs/contract.md#approvals: a decision kept is one this version's approval
            # would have asked of the same people (a plain wait's resume is no approval).
            errors.append({"path": f"{path}.form", "message": "another approval"})
    own = set(target.step(from_step).depends_on)
    if (
        from_step in {s.id for s in original.steps}
        and set(original.step(from_step).depends_on) != own
    ):
        errors.append({"path": f"$.steps.{from_step}.depends_on", "message": "other dependencies"})
    return errors


@dataclass(frozen=True)
class Replayed:
    """A replay made: the new execution, what it replays, from where, on which version."""

    execution_id: str
    replay_of: str
    from_step: str
    version: int
    status: str

    def view(self) -> dict[str, Any]:
        """The API's answer."""
        return {
            "execution_id": self.execution_id,
            "replay_of": self.replay_of,
            "from_step": self.from_step,
            "version": self.version,
            "status": self.status,
        }


def _target_version(
    conn: psycopg.Connection, original: Run, version: int | None, from_step: str
) -> tuple[Any, int, Definition]:
    """The version replayed onto (id, number, definition); InvalidReplay when the workflow
    has no such version or the version no step `from_step`."""
    row = conn.execute(
        TARGET_VERSION, {"workflow_id": original.workflow_id, "version": version}
    ).fetchone()
    if row is None:
        raise InvalidReplay(
            f"workflow {original.workflow!r} has no version {version}",
            [{"path": "$.version", "message": "no such version"}],
        )
    version_id, number = row
    target = definition_for(conn, version_id)
    if from_step not in {s.id for s in target.steps}:
        raise InvalidReplay(
            f"version {number} has no step {from_step!r}",
            [{"path": "$.from_step", "message": "not a step of the target version"}],
        )
    return version_id, number, target


def _kept_upstream(
    original: Run, target: Definition, number: int, from_step: str
) -> frozenset[str]:
    """The steps upstream of `from_step` whose recorded outputs the replay keeps;
    ReplayRefused when that part of the definition changed or a step of it has no
    recorded output."""
    errors = upstream_differences(original.definition, target, from_step)
    if errors:
        raise ReplayRefused(
            f"the part upstream of {from_step!r} differs between version "
            f"{original.version} and version {number}",
            errors,
        )
    upstream = target.ancestors(from_step)
    for step_id in sorted(upstream):
        state = original.steps[step_id]
        if state.status == StepStatus.UNKNOWN:
            errors.append(
                {
                    "path": f"$.steps.{step_id}",
                    "message": "unknown: resolve it first (its request may have been sent)",
                }
            )
        elif state.status not in DONE_STEP:
            errors.append(
                {
                    "path": f"$.steps.{step_id}",
                    "message": f"{state.status}: no recorded output; replay from it "
                    "or an earlier step",
                }
            )
    if errors:
        raise ReplayRefused(
            f"an upstream step of {from_step!r} has no recorded output to keep", errors
        )
    return upstream


def replay(
    conn: psycopg.Connection,
    execution_id: str,
    from_step: str,
    version: int | None,
    *,
    actor: dict[str, Any],
) -> Replayed:
    """Replay one execution from `from_step` onto `version` (None: the newest), in one
    unit of work under the original's row lock (two replays of one execution at once
    are made one after the other, each checked against the same recorded outputs)."""
    with unit_of_work(conn):
        original = load_run(conn, execution_id)
        if original is None:
            raise NotFound(f"execution {execution_id} does not exist")
        if original.status not in REPLAYABLE:
            raise Conflict(
                f"execution is {original.status}; only a finished, paused or needs_attention "
                "execution is replayed (pause or cancel it first)"
            )
        version_id, number, target = _target_version(conn, original, version, from_step)
        upstream = _kept_upstream(original, target, number, from_step)
        new_id = str(uuid7())
        body = json.dumps(original.input).encode()
        ckey = flowcontrol.concurrency_key(target, body)
        # The pinned version's priority, from the original's input (docs/contract.md#priority).
        priority = intake.priority_params(target, body)["priority"]
        steps = [_step_row(original, s.id, s.type, s.id in upstream) for s in target.steps]
        params = {
            "id": new_id,
            "original": execution_id,
            "version_id": version_id,
            "from_step": from_step,
            "ckey": ckey,
            "priority": priority,
            "deadline_s": target.deadline_s,
            "queued": ExecutionStatus.QUEUED.value,
            "steps": Jsonb(steps, dumps=_dumps),
            "queued_kind": execution_event(ExecutionStatus.QUEUED),
            "created": Jsonb(
                {
                    "to": ExecutionStatus.QUEUED.value,
                    "version": number,
                    "replay_of": execution_id,
                    "from_step": from_step,
                    "kept": sorted(upstream),
                    "actor": dict(actor),
                }
            ),
            "replayed_kind": EventKind.EXECUTION_REPLAYED.value,
            "replayed": Jsonb(
                {
                    "replayed_by": new_id,
                    "from_step": from_step,
                    "version": number,
                    "actor": dict(actor),
                }
            ),
        }
        conn.execute(creation.CREATE_REPLAY, params)
        if attributes := intake.attribute_params(target, body):
            conn.execute(creation.INSERT_ATTRIBUTES, {"id": new_id, **attributes})
        conn.execute(CREATE_STEPS, params)
        conn.execute(RECORD, params)
        if ckey is not None:
            # A slot now, or Conflict (all held) and nothing of the replay is kept.
            flowcontrol.take_slot_for_retry(conn, original.workflow_id, ckey, new_id)
        run = load_run(conn, new_id)
        assert run is not None  # inserted above, in this transaction
        run.advance()
        save_run(conn, run.take_changes())
    return Replayed(new_id, execution_id, from_step, number, run.status)


def _step_row(original: Run, step_id: str, type_: str, kept: bool) -> dict[str, Any]:
    if not kept:
        return {"step_id": step_id, "type": type_, "status": StepStatus.PENDING.value}
    state = original.steps[step_id]
    return {
        "step_id": step_id,
        "type": type_,
        "status": state.status,
        "output": state.output,
        "started_at": state.started_at,
        "finished_at": state.finished_at,
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, default=lambda v: v.isoformat() if isinstance(v, datetime) else v)


def links(conn: psycopg.Connection, execution_id: str) -> dict[str, Any]:
    """An execution's replay links: what it replays (and from which step), what replays it.
    `replay_of_deleted` says the original is gone (retention deleted it); the id stays, as
    in the replay's first history entry, so the link is never silently dropped."""
    row = conn.execute(REPLAY_OF, {"id": execution_id}).fetchone()
    replayed_by = [r[0] for r in conn.execute(REPLAYED_BY, {"id": execution_id}).fetchall()]
    return {
        "replay_of": row[0] if row else None,
        "replay_from": row[1] if row else None,
        "replay_of_deleted": bool(row and row[2]),
        "replayed_by": replayed_by,
    }


# ---- bulk -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filter:
    """Which executions of one workflow a bulk replay takes (None: any)."""

    workflow: str
    version: int | None = None
    status: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    error: str | None = None
    # The failed inbox's groups: the step that failed (status `failed`).
    step: str | None = None
    # docs/contract.md#search-attributes: (name, value) pairs an execution must all have.
    attributes: tuple[tuple[str, str], ...] = ()

    def params(self, upto: str | None = None, after: str | None = None) -> dict[str, Any]:
        """The SELECTION parameters."""
        return {
            "workflow": self.workflow,
            "version": self.version,
            "status": self.status,
            "since": self.since,
            "until": self.until,
            "error": self.error,
            "step": self.step,
            "attr_names": [name for name, _ in self.attributes] if self.attributes else None,
            "attr_values": [value for _, value in self.attributes] if self.attributes else None,
            "upto": upto,
            "after": after,
        }


def preview(conn: psycopg.Connection, flt: Filter) -> dict[str, Any]:
    """How many executions the filter takes now, and the newest of them: the `upto` a
    confirmation passes back, so later arrivals stay out of the bulk action."""
    count, upto = conn.execute(PREVIEW, flt.params()).fetchone() or (0, None)
    return {"count": int(count), "upto": upto}


def batch_ids(
    conn: psycopg.Connection, flt: Filter, *, upto: str | None, after: str | None, limit: int
) -> list[str]:
    """The ids of one batch the filter takes, oldest first after the cursor `after`, none
    newer than `upto`: the one walk of a bulk action, the API's replay and the console's
    failed inbox alike."""
    return [r[0] for r in conn.execute(BATCH, {**flt.params(upto, after), "limit": limit})]


def replay_batch(
    conn: psycopg.Connection,
    flt: Filter,
    from_step: str,
    version: int | None,
    *,
    upto: str,
    after: str | None,
    limit: int,
    actor: dict[str, Any],
) -> dict[str, Any]:
    """One confirmed batch, oldest first: each replay in its own unit of work with the
    actor; one refused is listed with why and does not stop the others. `next_after` is
    the cursor of the next batch (None: done)."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidReplay(
            f"limit must be from 1 to {MAX_PAGE}", [{"path": "$.limit", "message": "out of range"}]
        )
    ids = batch_ids(conn, flt, upto=upto, after=after, limit=limit)
    return _replay_each(conn, ids, from_step, version, limit=limit, actor=actor)


def _replay_each(
    conn: psycopg.Connection,
    ids: list[str],
    from_step: str,
    version: int | None,
    *,
    limit: int,
    actor: dict[str, Any],
) -> dict[str, Any]:
    """Replay each of one page of executions in its own unit of work; the batch answer.

    A filtered batch and a failure group's batch answer alike: one refused is listed with
    why and does not stop the others, and a full page means there may be a next one."""
    replayed, refused = [], []
    for execution_id in ids:
        try:
            made = replay(conn, execution_id, from_step, version, actor=actor)
        except ClientError as exc:
            refused.append({"execution_id": execution_id, "detail": exc.detail})
        else:
            replayed.append(made.execution_id)
    return {
        "replayed": replayed,
        "refused": refused,
        "next_after": ids[-1] if len(ids) == limit else None,
    }


# The failed inbox (docs/contract.md#failed-inbox): failed executions not replayed yet, grouped by
# workflow, the step that failed and its error, the group with the oldest execution first.
FAILED_GROUPS = """
SELECT w.key AS workflow, s.step_id, s.error, count(*) AS n, min(e.created_at) AS oldest,
       max(e.id::text) AS upto, w.latest_version,
       array_agg(DISTINCT v.version ORDER BY v.version) AS versions
FROM executions e
JOIN steps s ON s.execution_id = e.id AND s.status = 'failed'
JOIN workflows w ON w.id = e.workflow_id
JOIN workflow_versions v ON v.id = e.version_id
WHERE e.status = 'failed'
  AND (%(workflows)s::text[] IS NULL OR w.key = ANY(%(workflows)s))
  AND NOT EXISTS (SELECT 1 FROM executions r WHERE r.replay_of = e.id)
GROUP BY w.key, w.latest_version, s.step_id, s.error
ORDER BY min(e.created_at), w.key, s.step_id
LIMIT %(limit)s
"""


def failed_groups(
    conn: psycopg.Connection, workflows: tuple[str, ...] | None, limit: int = 100
) -> list[dict[str, Any]]:
    """The failed inbox's groups, oldest first (at most `limit`); `upto` fixes each
    group's set for a bulk action, so later failures stay out."""
    params = {"workflows": sorted(workflows) if workflows is not None else None, "limit": limit}
    with conn.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(FAILED_GROUPS, params).fetchall())


# One execution of a failed inbox's group: its step failed with exactly the group's error.
FAILED_WITH = """
SELECT 1 FROM steps
WHERE execution_id = %(id)s AND step_id = %(step)s AND status = 'failed' AND error = %(error)s
"""


def failed_with(conn: psycopg.Connection, execution_id: str, step_id: str, error: str) -> bool:
    """Whether the execution's step failed with exactly this error (its inbox group): a
    group's bulk action takes only its own executions."""
    params = {"id": execution_id, "step": step_id, "error": error}
    return conn.execute(FAILED_WITH, params).fetchone() is not None


# ---- failure groups (docs/contract.md#failure-groups) -------------------------------------
# A group's executions still failed or held for an operator, replayed or retried a batch at
# a time, oldest first after a cursor (`after`); one refused is listed with why and does not
# stop the others, and the cursor moves past it, so `next_after` finishes the group.


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


def replay_group(
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
    return _replay_each(conn, ids, step, version, limit=limit, actor=actor)


def retry_group(
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
