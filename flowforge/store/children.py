"""Child workflows (docs/contract.md#child-workflows): what a workflow step starts, what its parent
reads of it, and how the child's end reaches the parent.

- A workflow step starts its child in the unit of work that moves it to `waiting`: the
  child is written through creation's one builder, under a system idempotency key of the
  step's round (engine.child_key), so however often that unit of work is re-run after a
  kill, one child exists per round — and none when its transaction did not commit.
- The child's output is the output of its last step in definition order (like a map
  item's result, docs/contract.md#map), read when the parent loads; what went wrong is its first
  failed step's error, or its stop reason.
- The child never locks its parent: its transition to an end (or into or out of
  `needs_attention`) writes a wake-up of the parent's step in the same transaction, and
  the parent takes it up in a unit of work of its own. Lock order is parent, then child
  (a parent's cancel cancels the child in its own transaction), never the reverse, so
  the two cannot deadlock. A wake-up lost anyway is written again by the reconciler
  (LOST_WAKEUPS).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import Jsonb

from flowforge.domain.definitions.attributes import render_attributes
from flowforge.domain.model import (
    DEFAULT_MAX_CHILD_DEPTH,
    DEFAULT_MAX_DESCENDANTS,
    PARENT_CANCEL_ACTOR,
    TERMINAL_EXECUTION,
    ExecutionStatus,
    KeyOrigin,
    StepStatus,
    StepType,
    sql_list,
)
from flowforge.errors import FlowForgeError
from flowforge.store import archive
from flowforge.store.creation import create_execution, version_steps
from flowforge.store.db import one
from flowforge.store.outbox import INSERT_WAKEUPS

if TYPE_CHECKING:
    from flowforge.domain.definitions import Concurrency, Definition
    from flowforge.domain.kinds.workflow import ChildStart

# The newest version of each workflow a parent's workflow steps may start.
TARGETS = """
SELECT w.key, w.id, v.id, v.version
FROM workflows w
JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.latest_version
WHERE w.key = ANY(%(keys)s::text[]) AND w.archived_at IS NULL
"""
_TERMINAL = sql_list(tuple(sorted(TERMINAL_EXECUTION)))
# A parent's children, oldest first (a later round of a step replaces the earlier one):
# each one's status, its output once it succeeded, what went wrong once it ended badly (for
# one flow control stopped before it ever ran — dropped, refused, replaced — why it did).
CHILDREN = f"""
SELECT c.id::text, c.parent_step, c.status,
       CASE WHEN c.status = 'succeeded' THEN
           (SELECT s.output FROM steps s
            WHERE s.execution_id = c.id AND strpos(s.step_id, '[') = 0
            ORDER BY s.position DESC LIMIT 1) END AS output,
       CASE WHEN c.status IN {_TERMINAL} AND c.status <> 'succeeded' THEN
           coalesce((SELECT s.error FROM steps s
                     WHERE s.execution_id = c.id AND s.status = 'failed'
                     ORDER BY s.finished_at NULLS LAST, s.position LIMIT 1),
                    (SELECT s.error FROM steps s
                     WHERE s.execution_id = c.id AND c.stop_reason = 'concurrency'
                       AND c.slot_at IS NULL AND s.error IS NOT NULL
                     ORDER BY s.position LIMIT 1),
                    c.stop_reason) END AS error
FROM executions c
WHERE c.parent_id = %(id)s
ORDER BY c.created_at, c.id
"""
# The executions below a root, counted under an advisory lock on the root held to the end
# of the unit of work that may start more (runs.load_run): two parents of one tree never
# both take the last places. Lock order: the parent's row, then its tree's lock, then what
# admitting a child takes (flowcontrol); nothing waits for a row under the tree's lock.
LOCK_TREE = "SELECT pg_advisory_xact_lock(hashtextextended('flowforge:tree:' || %(root)s, 0))"
COUNT_DESCENDANTS = "SELECT count(*) FROM executions WHERE root_id = %(root)s::uuid"
# The child, through the one builder of executions (creation.py); a child of a workflow
# with a concurrency limit goes through flowcontrol.admit_child instead.
CREATE_CHILD = create_execution(child=True)
# The same with the child's search attributes (docs/contract.md#search-attributes).
CREATE_CHILD_ATTRIBUTED = create_execution(child=True, attributes=True)
# The parent's workflow step is woken by the child's end (runs.save_run).
WAKE_PARENT = f"{INSERT_WAKEUPS} VALUES (%(execution_id)s, %(step_id)s)"
# A child its parent's cancel found locked: the reaper applies it (actions.apply_pending_cancels).
RECORD_CANCEL = """
INSERT INTO pending_cancels (execution_id, actor) VALUES (%(id)s, %(actor)s)
ON CONFLICT (execution_id) DO NOTHING
"""
# Waiting workflow steps whose child ended (or went into or out of needs_attention) a
# while ago, with no wake-up on the way: the child's wake-up was lost (the reconciler).
LOST_WAKEUPS = f"""
WITH lost AS (
    SELECT s.execution_id, s.step_id FROM steps s
    JOIN executions c ON c.id = (s.output->>'execution_id')::uuid
                     AND c.parent_id = s.execution_id AND c.parent_step = s.step_id
    WHERE s.type = '{StepType.WORKFLOW.value}' AND s.status = '{StepStatus.WAITING.value}'
      AND (c.status IN {_TERMINAL}
           OR (c.status = 'needs_attention') <> (s.error IS NOT NULL))
      AND c.updated_at < now() - make_interval(secs => %(after_s)s)
      AND NOT EXISTS (SELECT 1 FROM outbox o
                      WHERE o.execution_id = s.execution_id AND o.step_id = s.step_id)
    LIMIT 1000
), sent AS (
    {INSERT_WAKEUPS} SELECT execution_id, step_id FROM lost
)
SELECT count(*) FROM lost
"""
# A parent's children, for the API, the console and the CLI; a queued one of a
# flow-controlled workflow says it waits for a concurrency slot (docs/contract.md#slots).
LINKS = """
SELECT c.id::text AS execution_id, c.parent_step AS step_id, w.key AS workflow,
       c.status, c.created_at,
       c.slot_at IS NULL AND c.concurrency_key IS NOT NULL AND c.status = 'queued'
           AS waiting_for_slot
FROM executions c JOIN workflows w ON w.id = c.workflow_id
WHERE c.parent_id = %(id)s
ORDER BY c.created_at, c.id
LIMIT 100
"""


class StaleChildTarget(FlowForgeError):
    """The workflow a child was to start changed between the parent's load and save (a
    newer version, archived): the unit of work rolls back and is taken up again."""


@functools.cache
def max_child_depth() -> int:
    """FLOWFORGE_MAX_CHILD_DEPTH, read once per process (config.Settings documents it)."""
    raw = os.environ.get("FLOWFORGE_MAX_CHILD_DEPTH", "").strip()
    if not raw:
        return DEFAULT_MAX_CHILD_DEPTH
    value = int(raw)
    if value < 1:
        raise ValueError("FLOWFORGE_MAX_CHILD_DEPTH must be at least 1")
    return value


@functools.cache
def max_descendants() -> int:
    """FLOWFORGE_MAX_DESCENDANTS, read once per process (config.Settings documents it)."""
    raw = os.environ.get("FLOWFORGE_MAX_DESCENDANTS", "").strip()
    if not raw:
        return DEFAULT_MAX_DESCENDANTS
    value = int(raw)
    if value < 1:
        raise ValueError("FLOWFORGE_MAX_DESCENDANTS must be at least 1")
    return value


def descendants(conn: psycopg.Connection, root_id: str) -> int:
    """How many executions `root_id` has below it, locking its tree for this transaction."""
    conn.execute(LOCK_TREE, {"root": root_id})
    return int(one(conn.execute(COUNT_DESCENDANTS, {"root": root_id}))[0])


def load_targets(conn: psycopg.Connection, keys: Iterable[str]) -> list[tuple[str, int, int, int]]:
    """(key, workflow id, version id, version) of the newest version of each workflow key
    that exists and is not archived (runs.load_run makes them the engine's ChildTarget)."""
    return [tuple(row) for row in conn.execute(TARGETS, {"keys": list(keys)}).fetchall()]


def load_children(conn: psycopg.Connection, execution_id: str) -> list[tuple[Any, ...]]:
    """(id, step id, status, output, error) of each child, oldest first (runs.load_run
    keeps each workflow step's newest as the engine's ChildState)."""
    return [tuple(row) for row in conn.execute(CHILDREN, {"id": execution_id}).fetchall()]


# flowcontrol.admit_child, handed in by runs.save_run (this module does not import flow
# control: that keeps the chain of imports short).
Admit = Callable[[psycopg.Connection, dict[str, Any], "Concurrency"], tuple[bool, bool, str]]


def attribute_params(definition: Definition, input_value: Any) -> dict[str, Any]:
    """A new execution's search attributes (docs/contract.md#search-attributes) as the
    statements' `attr_names` and `attr_values`; {} when its version declares none or none
    rendered, and the caller then runs the statement without them."""
    if not definition.attributes:
        return {}
    found = render_attributes(definition, input_value)
    if not found:
        return {}
    return {"attr_names": list(found), "attr_values": list(found.values())}


def start(
    conn: psycopg.Connection, parent_id: str, starts: Iterable[ChildStart], admit: Admit
) -> None:
    """Create the children a unit of work started, in its transaction. A key already
    claimed means this round's child exists: nothing more is written.

    A child of a workflow with a concurrency limit is admitted like any execution of it
    (flowcontrol, docs/contract.md#slots), under the same locks taken after the parent's row (the
    lock order flowcontrol states): it starts on a free slot, or waits queued for one while its
    parent waits for it. Dropped (drop_new) or refused (max_queued), it is written
    cancelled with reason concurrency, saying why, and its parent's step is woken in this
    transaction to fail on it: no retry loop, and the refusal stays visible as a child.
    Replacing (cancel_oldest), it is queued at the head, and the reconciler stops the
    holders it replaced (reconciler.SURPLUS_HOLDERS)."""
    for child in starts:
        target = child.target
        body = json.dumps(child.input, separators=(",", ":"))
        params = {
            "id": child.execution_id,
            "workflow_id": target.workflow_id,
            "version_id": target.version_id,
            "version": target.version,
            "secret_id": None,
            "input": body,
            "key": child.key,
            "key_origin": KeyOrigin.SYSTEM.value,
            "body_sha256": hashlib.sha256(body.encode()).digest(),
            "traceparent": None,
            **archive.NO_ARCHIVE,
            **version_steps(target.definition, target.version),
            "parent_id": parent_id,
            "parent_step": child.step_id,
            "depth": child.depth,
            "root_id": child.root_id,
            "priority": child.priority,
            "deadline_s": target.definition.deadline_s,
            "start_within_s": target.definition.start_within_s,
            **attribute_params(target.definition, child.input),
        }
        concurrency = target.definition.concurrency
        if concurrency is None:
            statement = CREATE_CHILD_ATTRIBUTED if "attr_names" in params else CREATE_CHILD
            current, _ = one(conn.execute(statement, params))
        else:
            params["ckey"] = child.concurrency_key
            current, created, mode = admit(conn, params, concurrency)
            if created and mode in ("drop", "refuse"):
                wake_parent(conn, (parent_id, child.step_id))
        if not current:
            raise StaleChildTarget(
                f"workflow {child.workflow!r} changed while execution {parent_id} started it"
            )


def wake_parent(conn: psycopg.Connection, parent: tuple[str, str]) -> None:
    """The parent's workflow step takes the child's news in a unit of work of its own."""
    conn.execute(WAKE_PARENT, {"execution_id": parent[0], "step_id": parent[1]})


def record_cancel(conn: psycopg.Connection, child_id: str) -> None:
    """A child its parent's cancel could not lock now: the reaper cancels it."""
    conn.execute(RECORD_CANCEL, {"id": child_id, "actor": Jsonb(PARENT_CANCEL_ACTOR)})


def links(conn: psycopg.Connection, execution_id: str) -> list[dict[str, Any]]:
    """An execution's children (docs/contract.md#child-workflows), oldest first, for its JSON: the
    other direction of the link is each child's `parent`."""
    rows = conn.execute(LINKS, {"id": execution_id}).fetchall()
    return [
        {
            "execution_id": child_id,
            "step_id": step_id,
            "workflow": workflow,
            "status": status,
            "created_at": created_at.isoformat(),
            "waiting_for_slot": bool(waiting_for_slot),
        }
        for child_id, step_id, workflow, status, created_at, waiting_for_slot in rows
    ]


def waiting_on(steps: list[dict[str, Any]], links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The children that waiting workflow steps wait for (each step's newest child), with
    whether the child needs an operator: why the parent is `waiting`."""
    newest = {link["step_id"]: link for link in links}
    waits = []
    for row in steps:
        link = newest.get(row["step_id"])
        if row["type"] == StepType.WORKFLOW and row["status"] == StepStatus.WAITING and link:
            waits.append(
                {
                    **link,
                    "needs_attention": link["status"] == ExecutionStatus.NEEDS_ATTENTION,
                }
            )
    return waits
