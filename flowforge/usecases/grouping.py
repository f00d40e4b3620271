"""Debounce and batch (docs/contract.md#debounce-batch): webhooks gathered in PostgreSQL, one
execution per group.

A webhook of a workflow whose newest version has `trigger.webhook.debounce` or `.batch`
does not start an execution. It is recorded as an event of its key's `open` group
(intake_groups, one per workflow, kind and rendered key: the partial unique index
intake_groups_open), in one pipelined transaction (one round trip) with its idempotency
key, which names the group's execution id, chosen when the group opened. Concurrent
events of one key meet on that index: INSERT ... ON CONFLICT DO UPDATE serialises them on
the group's row, so every event is counted once, in one group.

Each worker's scheduler thread starts due groups (Starter.start_one): a due group is claimed FOR
UPDATE SKIP LOCKED, its execution created through the flow-control intake statement
(concurrency, max_queued, deadlines and a paused workflow apply as to any webhook) and
the group marked `started`, all in one transaction — a worker killed at any point
committed all or nothing, and no two workers start one group. An event whose intake
waits for the row a starting worker holds finds the group gone from the index when that
commits, and opens the next one; an event committed before is in the group's execution.
A start refused by max_queued is tried again after the queue's Retry-After; a group that
can never start (workflow archived, a concurrency key its input cannot render) is marked
`failed` with the reason, and deleted with its events by housekeeping once its workflow's
retention_days passed (worker/retention.py EXPIRE_FAILED_GROUPS).

What a group's execution receives: debounce, the last event with `debounced` (how many
earlier events of the group started nothing); batch, `{"events": [...]}` in arrival
order. A batch closes (due at once) at `max_items` events or MAX_BATCH_BYTES of bodies.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from flowforge import faults
from flowforge.domain.definitions import Definition, Grouping
from flowforge.domain.model import FLOW_CONTROL_ACTOR, GroupStatus, KeyOrigin, sql_list
from flowforge.domain.templating import TemplateError, render
from flowforge.errors import ClientError, Conflict, FlowForgeError, NotFound
from flowforge.store import creation, flowcontrol
from flowforge.store.db import notify_relay, pipelined_transaction
from flowforge.usecases import actions, intake

logger = logging.getLogger(__name__)

# A batch closes when its bodies reach this many bytes, whatever max_items says: its
# execution input must stay far below jsonb's limit.
MAX_BATCH_BYTES = 16 * 1024 * 1024
MAX_KEY_CHARS = flowcontrol.MAX_KEY_CHARS
# Groups started per scheduler pass (one transaction each).
START_BATCH = 200
# Events shown with a group or an execution built from one.
EVENTS_SHOWN = 100
GROUPS_SHOWN = 100

# Claim the event's idempotency key, if the target is still current (flowcontrol.
# STILL_CURRENT), for a placeholder execution id; of concurrent claims of one key exactly one
# wins (the others wait for it and get no row). RECORD_EVENT, the next statement of the same
# transaction, sets the group's execution id on it.
CLAIM_KEY = f"""
INSERT INTO idempotency_keys (workflow_id, origin, key, body_sha256, execution_id)
SELECT %(workflow_id)s, %(key_origin)s, %(key)s, %(body_sha256)s, %(execution_id)s
FROM ({creation.STILL_CURRENT}) current
ON CONFLICT (workflow_id, origin, key) DO NOTHING
RETURNING 1
"""
# Record one event, if it has no key and the target is still current, or if this
# transaction's CLAIM_KEY claimed its key: join the key's open group or open it. A
# debounce's due time moves to a window after this event, never past its deadline
# (max_wait_s after the first); a batch's stays a window after the first, unless this
# event fills it (max_items or MAX_BATCH_BYTES): closed, due now. The claimed key is
# pointed at the group's execution (an update of the previous statement's row).
RECORD_EVENT = f"""
WITH current AS (
    {creation.STILL_CURRENT}
), claimed AS (
    SELECT 1 FROM idempotency_keys
    WHERE workflow_id = %(workflow_id)s AND origin = %(key_origin)s AND key = %(key)s
      AND execution_id = %(execution_id)s
), accepted AS (
    SELECT 1 FROM current WHERE %(key)s::text IS NULL
    UNION ALL SELECT 1 FROM claimed
), grp AS (
    INSERT INTO intake_groups (workflow_id, kind, group_key, status, execution_id, events,
                               bytes, due_at, deadline_at)
    SELECT %(workflow_id)s, %(kind)s, %(group_key)s,
           CASE WHEN %(max_items)s::int <= 1 OR %(bytes)s::bigint >= {MAX_BATCH_BYTES}
                THEN 'closed' ELSE 'open' END,
           %(execution_id)s, 1, %(bytes)s,
           CASE WHEN %(max_items)s::int <= 1 OR %(bytes)s::bigint >= {MAX_BATCH_BYTES}
                THEN now() ELSE now() + make_interval(secs => %(window_s)s) END,
           now() + make_interval(secs => coalesce(%(max_wait_s)s, %(window_s)s))
    FROM accepted
    ON CONFLICT (workflow_id, kind, group_key) WHERE status = 'open' DO UPDATE SET
        events = intake_groups.events + 1,
        bytes = intake_groups.bytes + excluded.bytes,
        last_at = now(),
        status = CASE WHEN intake_groups.events + 1 >= %(max_items)s::int
                        OR intake_groups.bytes + excluded.bytes >= {MAX_BATCH_BYTES}
                      THEN 'closed' ELSE 'open' END,
        due_at = CASE WHEN intake_groups.events + 1 >= %(max_items)s::int
                        OR intake_groups.bytes + excluded.bytes >= {MAX_BATCH_BYTES} THEN now()
                      WHEN intake_groups.kind = 'debounce'
                      THEN least(now() + make_interval(secs => %(window_s)s),
                                 intake_groups.deadline_at)
                      ELSE intake_groups.due_at END
    RETURNING *
), event AS (
    INSERT INTO intake_group_events (group_id, idempotency_key, body)
    SELECT id, %(key)s, %(input)s::jsonb FROM grp
), pointed AS (
    UPDATE idempotency_keys k SET execution_id = grp.execution_id FROM grp
    WHERE k.workflow_id = %(workflow_id)s AND k.origin = %(key_origin)s
      AND k.key = %(key)s AND k.execution_id = %(execution_id)s
      AND grp.execution_id <> %(execution_id)s
)
SELECT id, kind, group_key, status, execution_id::text, events, opened_at, last_at, due_at,
       deadline_at, started_at, reason,
       (SELECT key FROM workflows WHERE id = %(workflow_id)s) AS workflow
FROM grp
"""
# The group an execution id belongs to (a replayed event's answer, an execution's view).
GROUP_OF = """
SELECT g.id, g.kind, g.group_key, g.status, g.execution_id::text, g.events, g.opened_at,
       g.last_at, g.due_at, g.deadline_at, g.started_at, g.reason, w.key AS workflow
FROM intake_groups g JOIN workflows w ON w.id = g.workflow_id
WHERE g.execution_id = %(execution_id)s
"""
# A group not started yet: open, or closed (a full batch) and due.
UNSTARTED = (GroupStatus.OPEN, GroupStatus.CLOSED)
# One due group, claimed for this transaction; groups another worker holds, or whose
# event is being recorded right now, are skipped (and seen again in the next pass).
CLAIM_DUE = f"""
SELECT g.id, g.kind, g.execution_id::text, g.events, w.key, w.archived_at IS NOT NULL
FROM intake_groups g JOIN workflows w ON w.id = g.workflow_id
WHERE g.status IN {sql_list(UNSTARTED)} AND g.due_at <= now()
ORDER BY g.due_at
LIMIT 1
FOR UPDATE OF g SKIP LOCKED
"""
# A group's execution input, built in the database: the last event with `debounced`, or
# every event in arrival order.
DEBOUNCE_INPUT = """
SELECT (body || jsonb_build_object('debounced', %(events)s::int - 1))::text
FROM intake_group_events WHERE group_id = %(id)s ORDER BY id DESC LIMIT 1
"""
BATCH_INPUT = """
SELECT jsonb_build_object('events', jsonb_agg(body ORDER BY id))::text
FROM intake_group_events WHERE group_id = %(id)s
"""
MARK_STARTED = """
UPDATE intake_groups SET status = 'started', started_at = now(),
       started_execution = execution_id
WHERE id = %(id)s
"""
MARK_FAILED = """
UPDATE intake_groups SET status = 'failed', started_at = now(), reason = %(reason)s
WHERE id = %(id)s
"""
DEFER = """
UPDATE intake_groups SET due_at = now() + make_interval(secs => %(after_s)s),
       reason = %(reason)s
WHERE id = %(id)s
"""
# How long until the next group is due (the scheduler's sleep).
NEXT_DUE = f"""
SELECT extract(epoch FROM min(due_at) - now()) FROM intake_groups
WHERE status IN {sql_list(UNSTARTED)}
"""
# A workflow's groups, newest first: the open ones (and closed, due) and the last started.
GROUPS = """
SELECT g.id, g.kind, g.group_key, g.status, g.execution_id::text, g.events, g.opened_at,
       g.last_at, g.due_at, g.deadline_at, g.started_at, g.reason, w.key AS workflow
FROM intake_groups g JOIN workflows w ON w.id = g.workflow_id
WHERE w.key = %(key)s AND (%(status)s::text IS NULL OR g.status = %(status)s)
ORDER BY g.id DESC LIMIT %(limit)s
"""
GROUP_BY_ID = """
SELECT g.id, g.kind, g.group_key, g.status, g.execution_id::text, g.events, g.opened_at,
       g.last_at, g.due_at, g.deadline_at, g.started_at, g.reason, w.key AS workflow
FROM intake_groups g JOIN workflows w ON w.id = g.workflow_id
WHERE w.key = %(key)s AND g.id = %(id)s
"""
EVENTS = """
SELECT id, received_at, idempotency_key, body FROM intake_group_events
WHERE group_id = %(id)s ORDER BY id LIMIT %(limit)s
"""
STATUSES = tuple(status.value for status in GroupStatus)


class KeyUnresolved(ClientError):
    """The group key template does not resolve against this webhook's body."""

    status = 422
    title = "Group key unresolved"


class NotAnObject(ClientError):
    """A debounced execution's input is its event plus `debounced`: an object is needed."""

    status = 422
    title = "Debounced event is not an object"


def group_key(grouping: Grouping, data: Any) -> str:
    """The rendered key of an event's group ('' without a key template)."""
    if grouping.key is None:
        return ""
    try:
        value = render(grouping.key, {"input": data})
    except TemplateError as exc:
        raise KeyUnresolved(f"{grouping.kind} key {grouping.key!r}: {exc}") from None
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if len(text) > MAX_KEY_CHARS or "\x00" in text:
        raise KeyUnresolved(
            f"{grouping.kind} key must render to at most {MAX_KEY_CHARS} characters without NUL"
        )
    return text


def is_grouped(definition: Definition) -> bool:
    """Whether a version's webhooks are gathered into groups instead of starting at once."""
    return definition.grouping is not None


def record(
    conn: psycopg.Connection,
    target: intake.Target,
    body: bytes,
    idempotency_key: str | None,
    secret_id: int | None,
    origin: KeyOrigin = KeyOrigin.CLIENT,
) -> intake.Accepted:
    """Record a validated webhook body as an event of its key's group, in one transaction
    with its idempotency key (in `origin`'s key space: a source's is the system's); a known
    key is a replay answered with its group (never counted twice). Raises StaleTarget when
    `target` is out of date."""
    grouping = target.definition.grouping
    assert grouping is not None
    data = json.loads(body)
    if grouping.kind == "debounce" and not isinstance(data, dict):
        raise NotAnObject(
            "a debounced workflow's execution gets the last event plus `debounced`: send a "
            "JSON object"
        )
    body_sha256 = hashlib.sha256(body).digest()
    params = {
        "workflow_id": target.workflow_id,
        "version": target.version,
        "secret_id": secret_id,
        "kind": grouping.kind,
        "group_key": group_key(grouping, data),
        "execution_id": str(intake.uuid7()),
        "key": idempotency_key,
        "key_origin": origin.value,
        "body_sha256": body_sha256,
        "input": body.decode(),
        "bytes": len(body),
        "window_s": grouping.window_s,
        "max_wait_s": grouping.max_wait_s,
        "max_items": grouping.max_items,
    }
    # One round trip on an idle connection (BEGIN, the claim, the event and COMMIT in one
    # pipeline); inside a source's routing transaction, a savepoint of it.
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        block: Any = pipelined_transaction(conn)
    else:
        block = conn.transaction()
    with conn.cursor(row_factory=dict_row) as event:
        with block:
            if idempotency_key is not None:
                conn.execute(CLAIM_KEY, params)
            event.execute(RECORD_EVENT, params)
        row = event.fetchone()
    if row is not None:
        return intake.Accepted(row["execution_id"], replayed=False, group=_view(row))
    existing = None
    if idempotency_key is not None:
        existing = conn.execute(intake.EXISTING_KEY, params).fetchone()
    if existing is None:
        # No key to replay: the claim (or the event, without a key) found the target stale.
        raise intake.StaleTarget(f"workflow {target.workflow_id} changed since it was cached")
    existing_sha, existing_id = existing
    if existing_sha != body_sha256:
        raise Conflict("this idempotency key was already used with a different body")
    return intake.Accepted(str(existing_id), replayed=True, group=group_of(conn, str(existing_id)))


def group_of(conn: psycopg.Connection, execution_id: str) -> dict[str, Any] | None:
    """The group an execution id was (or will be) started from, or None."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(GROUP_OF, {"execution_id": execution_id}).fetchone()
    return None if row is None else _view(row)


def _view(row: dict[str, Any]) -> dict[str, Any]:
    """A group as the API shows it."""
    return {
        "id": row["id"],
        "workflow": row["workflow"],
        "kind": row["kind"],
        "key": row["group_key"],
        "status": row["status"],
        "execution_id": row["execution_id"],
        "events": row["events"],
        "opened_at": row["opened_at"].isoformat(),
        "last_at": row["last_at"].isoformat(),
        "due_at": row["due_at"].isoformat(),
        "deadline_at": row["deadline_at"].isoformat(),
        "started_at": row["started_at"].isoformat() if row["started_at"] else None,
        "reason": row["reason"],
    }


def groups(
    conn: psycopg.Connection, key: str, status: str | None, limit: int = GROUPS_SHOWN
) -> list[dict[str, Any]]:
    """A workflow's groups, newest first (only those of `status`, if given)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(GROUPS, {"key": key, "status": status, "limit": limit}).fetchall()
    return [_view(row) for row in rows]


def group(conn: psycopg.Connection, key: str, group_id: int) -> dict[str, Any]:
    """One group of a workflow with its first events, or NotFound."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(GROUP_BY_ID, {"key": key, "id": group_id}).fetchone()
    if row is None:
        raise NotFound(f"workflow {key!r} has no group {group_id}")
    return _with_events(conn, _view(row))


def built_from(conn: psycopg.Connection, execution_id: str) -> dict[str, Any] | None:
    """What an execution was built from: its group and the group's first EVENTS_SHOWN
    events (when each came, its idempotency key, its body); None for one that was not."""
    found = group_of(conn, execution_id)
    return None if found is None else _with_events(conn, found)


def _with_events(conn: psycopg.Connection, group: dict[str, Any]) -> dict[str, Any]:
    """A group's view with its first EVENTS_SHOWN events as `event_list`."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(EVENTS, {"id": group["id"], "limit": EVENTS_SHOWN}).fetchall()
    group["event_list"] = [
        {
            "id": r["id"],
            "received_at": r["received_at"].isoformat(),
            "idempotency_key": r["idempotency_key"],
            "body": r["body"],
        }
        for r in rows
    ]
    return group


@dataclass(frozen=True)
class Started:
    """What became of one due group: `started` (its execution created), `deferred` (the
    queue was full: tried again later) or `failed` (the workflow is gone)."""

    group_id: int
    workflow: str
    kind: str
    outcome: str
    execution_id: str
    events: int
    reason: str | None = None


class Starter:
    """Starts due groups: the scheduler's part for docs/contract.md#debounce-batch. Holds a small
    cache of intake targets (re-checked by the intake statement)."""

    def __init__(self) -> None:
        self._targets = intake.UnsignedTargets()

    def start_one(self, conn: psycopg.Connection) -> Started | None:
        """Claim one due group and start its execution, in one transaction; None when no
        group is due. Holders replaced by on_full cancel_oldest are stopped after the
        commit, as the webhook intake does."""
        replaced: tuple[str, ...] = ()
        woke = False
        with conn.transaction():
            row = conn.execute(CLAIM_DUE).fetchone()
            if row is None:
                return None
            group_id, kind, execution_id, events, key, archived = row
            if archived:
                reason = f"workflow {key!r} was archived before the group started"
                conn.execute(MARK_FAILED, {"id": group_id, "reason": reason})
                return Started(group_id, key, kind, "failed", execution_id, events, reason)
            statement = DEBOUNCE_INPUT if kind == "debounce" else BATCH_INPUT
            (text,) = conn.execute(statement, {"id": group_id, "events": events}).fetchone() or (
                None,
            )
            body = (text or "{}").encode()
            try:
                outcome = self._create(conn, key, execution_id, body)
            except FlowForgeError as exc:
                # Never startable as it is (the workflow's concurrency key does not render
                # against the group's input, the workflow is gone): recorded, not retried.
                reason = f"not started: {exc}"
                conn.execute(MARK_FAILED, {"id": group_id, "reason": reason})
                return Started(group_id, key, kind, "failed", execution_id, events, reason)
            if isinstance(outcome, flowcontrol.Decision):
                conn.execute(MARK_STARTED, {"id": group_id})
                faults.hit("group_started")  # a kill here rolls back: the group stays due
                replaced, woke = outcome.replaced, outcome.mode in ("start", "replace")
                result = Started(group_id, key, kind, "started", execution_id, events)
            else:
                after_s, reason = outcome
                conn.execute(DEFER, {"id": group_id, "after_s": after_s, "reason": reason})
                result = Started(group_id, key, kind, "deferred", execution_id, events, reason)
        if woke:
            notify_relay(conn)
        actions.stop_replaced(conn, replaced, actor=FLOW_CONTROL_ACTOR)
        return result

    def _create(
        self, conn: psycopg.Connection, key: str, execution_id: str, body: bytes
    ) -> flowcontrol.Decision | tuple[int, str]:
        """The group's execution through the flow-control intake statement (in the
        caller's transaction), on the workflow's newest version; or, when max_queued
        refuses it, (seconds, why) to try later. Raises FlowForgeError for a group that
        cannot start (a concurrency key that does not render against its input)."""
        for fresh in (False, True):
            target = self._targets.get(conn, key, fresh)
            params = _params(target, execution_id, body)
            if params["ckey"] is not None:
                if params["max_queued"] is not None:
                    conn.execute(flowcontrol.QUEUE_LOCK, params)
                conn.execute(flowcontrol.SLOT_LOCK, params)
            statement = (
                flowcontrol.GATED_ATTRIBUTED if "attr_names" in params else flowcontrol.GATED_INTAKE
            )
            row = conn.execute(statement, params).fetchone()
            assert row is not None
            current, created, mode, oldest, _ = row
            if not current:
                continue
            if mode == "refuse":
                started, _ = conn.execute(flowcontrol.DRAIN_RATE, params).fetchone() or (0, 0)
                return (
                    flowcontrol.retry_after(int(started)),
                    "the workflow's queue is full (concurrency.max_queued); tried again later",
                )
            assert created
            return flowcontrol.Decision(
                True, True, mode, tuple(oldest) if mode == "replace" else ()
            )
        raise Conflict(f"workflow {key!r} keeps changing; try again")


def _params(target: intake.Target, execution_id: str, body: bytes) -> dict[str, Any]:
    """GATED_INTAKE's parameters for a group's execution: the webhook intake's, with the
    group's execution id and no idempotency key of its own (the group row, claimed and
    marked in the same transaction, makes it once)."""
    return {
        "id": execution_id,
        "workflow_id": target.workflow_id,
        "version_id": target.version_id,
        "version": target.version,
        "secret_id": None,
        "input": body.decode(),
        "key": None,
        "key_origin": KeyOrigin.SYSTEM.value,
        "body_sha256": hashlib.sha256(body).digest(),
        **intake.INTAKE_PARAMS,
        **target.steps,
        **flowcontrol.intake_params(target.definition, body),
        **intake.priority_params(target.definition, body),
        **intake.attribute_params(target.definition, body),
    }


def next_due(conn: psycopg.Connection) -> float | None:
    """Seconds until the next group is due (negative: overdue), None when none is open."""
    row = conn.execute(NEXT_DUE).fetchone()
    return None if row is None or row[0] is None else float(row[0])
