"""Read models of executions for the API and the CLI: one execution in full, or a page."""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from flowforge.domain.model import (
    ExecutionQuery,
    ExecutionStatus,
    ItemStatus,
    StepStatus,
    item_status,
    sql_list,
)
from flowforge.errors import ClientError, NotFound
from flowforge.store import attention, children, flowcontrol, search
from flowforge.store.db import one
from flowforge.store.runs import definition_for
from flowforge.store.search import uuid_floor

EXECUTION = """
SELECT e.id, w.key AS workflow, v.version, e.version_id, e.status, e.input, e.trigger,
       e.idempotency_key, e.priority,
       e.created_at, e.started_at, e.finished_at, e.updated_at, e.cancel_requested_at,
       e.parent_id, e.parent_step, e.depth,
       e.parent_id IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM executions p WHERE p.id = e.parent_id)
           AS parent_deleted
FROM executions e
JOIN workflows w ON w.id = e.workflow_id
JOIN workflow_versions v ON v.id = e.version_id
WHERE e.id = %(id)s
"""
# The workflow's own steps, their attempts and history: a map's items (rows such as
# `lines[3].reserve`, docs/contract.md#map) are summed up per map instead (ITEM_COUNTS, ITEMS), so
# the page of a map of 10,000 items stays one page.
STEPS = """
SELECT step_id, type, status, attempts, wake_at, output, error, started_at, finished_at,
       lease_owner, lease_expires_at
FROM steps WHERE execution_id = %(id)s AND strpos(step_id, '[') = 0 ORDER BY position
"""
ATTEMPTS = """
SELECT step_id, attempt, worker, started_at, finished_at, outcome, error, http_status, duration_ms,
       request, response
FROM attempts WHERE execution_id = %(id)s AND strpos(step_id, '[') = 0 ORDER BY id
"""
EVENTS = """
SELECT at, step_id, kind, detail FROM execution_events
WHERE execution_id = %(id)s AND (step_id IS NULL OR strpos(step_id, '[') = 0) ORDER BY id
"""
# The started items of a map that did not succeed (docs/contract.md#map), each with the statuses of
# its rows that are not succeeded or skipped: the in-flight, queued-again, failed,
# cancelled and unknown ones, through the partial index steps_items_unsettled (0033).
# Every other started item succeeded, so a map of 10,000 items that went well reads
# nothing here, and a count by status never reads every item's rows.
# The partial index's own predicate, in its order (sql/0033).
SETTLED = (StepStatus.SUCCEEDED, StepStatus.SKIPPED)
ITEM_TROUBLE = f"""
SELECT left(step_id, strpos(step_id, ']')) AS item, array_agg(status) AS statuses
FROM steps
WHERE execution_id = %(id)s AND starts_with(step_id, %(prefix)s)
  AND strpos(step_id, '[') > 0 AND status NOT IN {sql_list(SETTLED)}
GROUP BY 1
"""
# How many items of a map have rows, for a map that started before its output said so
# ("started", flowforge/domain/engine.py): the one read of every item row left, and only
# for such a map.
ITEMS_STARTED = """
SELECT count(DISTINCT left(step_id, strpos(step_id, ']'))) FROM steps
WHERE execution_id = %(id)s AND starts_with(step_id, %(prefix)s)
"""
# The rows of some items of a map, for a page of them.
ITEM_ROWS = """
SELECT step_id, type, status, attempts, output, error, started_at, finished_at
FROM steps WHERE execution_id = %(id)s AND step_id = ANY(%(rows)s)
"""
# What every list of executions shows of one (PAGE, NEEDS_ATTENTION_PAGE, PAGE_OF_IDS):
# each adds its WHERE and ORDER BY, so the three lists show the same columns.
_LISTED_EXECUTIONS = """
SELECT e.id, w.key AS workflow, v.version, e.status, e.priority, e.created_at,
       e.started_at, e.finished_at
FROM executions e
JOIN workflows w ON w.id = e.workflow_id
JOIN workflow_versions v ON v.id = e.version_id
"""
# Keyset pagination, newest first, on the primary key: execution ids are UUIDv7, ordered
# by creation time; the cursor is the last row's id.
PAGE = f"""{_LISTED_EXECUTIONS}\
WHERE (%(workflow)s::text IS NULL OR w.key = %(workflow)s)
  AND (%(workflows)s::text[] IS NULL OR w.key = ANY(%(workflows)s))
  AND (%(status)s::text IS NULL OR e.status = %(status)s)
  AND (%(after)s::uuid IS NULL OR e.id < %(after)s)
  AND (%(since)s::uuid IS NULL OR e.id >= %(since)s)
  AND (%(until)s::uuid IS NULL OR e.id < %(until)s)
ORDER BY e.id DESC
LIMIT %(limit)s
"""
# `needs_attention` means "has a step whose outcome is unknown", whatever the execution's
# own status: a cancelled execution can keep one, and an operator must still find it. The
# partial index steps_unknown holds only such steps (every needs_attention execution has
# one), so this never scans the steps table.
NEEDS_ATTENTION_PAGE = f"""{_LISTED_EXECUTIONS}\
WHERE e.id IN (SELECT n.execution_id FROM ({attention.NEEDING_OPERATOR}) n
               WHERE %(after)s::uuid IS NULL OR n.execution_id < %(after)s)
  AND (%(since)s::uuid IS NULL OR e.id >= %(since)s)
  AND (%(until)s::uuid IS NULL OR e.id < %(until)s)
  AND (%(workflow)s::text IS NULL OR w.key = %(workflow)s)
  AND (%(workflows)s::text[] IS NULL OR w.key = ANY(%(workflows)s))
ORDER BY e.id DESC
LIMIT %(limit)s
"""
# A page by search attributes (docs/contract.md#search-attributes): the ids come from the
# console's list (search.page), whose query is shaped for the indexes whichever filters
# are set (a rare attribute drives it from execution_attributes_lookup, a common one with
# a narrow workflow and status from the executions' own index); the page's rows are then
# read by primary key.
PAGE_OF_IDS = f"""{_LISTED_EXECUTIONS}\
WHERE e.id = ANY(%(ids)s::uuid[])
ORDER BY e.id DESC
"""
# An execution's search attributes, for its detail.
ATTRIBUTES = "SELECT name, value FROM execution_attributes WHERE execution_id = %(id)s"
WORKFLOW_OF = """
SELECT w.key FROM executions e JOIN workflows w ON w.id = e.workflow_id WHERE e.id = %(id)s
"""
# What a live page compares to know the execution changed (docs/contract.md#live-progress):
# its newest history row (every transition writes one, execution_events_by_execution
# answers it from the index's last entry) and its row's updated_at; two primary-key-sized
# lookups, no parse.
CHANGE_VERSION = """
SELECT e.status,
       coalesce((SELECT max(v.id) FROM execution_events v WHERE v.execution_id = e.id), 0),
       (extract(epoch FROM e.updated_at) * 1000000)::bigint,
       (SELECT w.key FROM workflows w WHERE w.id = e.workflow_id)
FROM executions e WHERE e.id = %(id)s
"""


class BadCursor(ClientError):
    """The pagination cursor was not one this API handed out."""

    title = "Invalid cursor"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def workflow_of(conn: psycopg.Connection, execution_id: str) -> str:
    """The workflow key an execution belongs to (for API key scopes)."""
    row = conn.execute(WORKFLOW_OF, {"id": execution_id}).fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} does not exist")
    return row[0]


@dataclass(frozen=True)
class ChangeVersion:
    """Where an execution stands, for a live page: `version` is an opaque `<event>.<micros>`
    that moves whenever its steps, history or status do."""

    version: str
    status: str
    workflow: str


def change_version(conn: psycopg.Connection, execution_id: str) -> ChangeVersion | None:
    """The execution's change version, status and workflow; None when it does not exist."""
    row = conn.execute(CHANGE_VERSION, {"id": execution_id}).fetchone()
    if row is None:
        return None
    status, event, micros, workflow = row
    return ChangeVersion(f"{event}.{micros}", status, workflow)


def map_items(
    conn: psycopg.Connection,
    execution_id: str,
    map_id: str,
    body: list[str],
    map_status: str,
    map_output: Any,
    *,
    status: str | None = None,
    after: int = -1,
    limit: int = 20,
) -> dict[str, Any]:
    """A map's items (docs/contract.md#map): counts by status, and a page of items in index order
    (optionally of one status), each with its steps' rows; `next_after` continues it.

    Counted without reading every item: the map's output says how many items there are
    and how many started (map_extent); the started ones that did not succeed are few
    and read through an index (ITEM_TROUBLE); the rest of the started ones succeeded."""
    prefix = f"{map_id}["
    count, started = map_extent(map_status, map_output)
    if started is None:
        started = one(conn.execute(ITEMS_STARTED, {"id": execution_id, "prefix": prefix}))[0]
    params = {"id": execution_id, "prefix": prefix}
    # Without a status the page is known before the counts: both reads in one round trip.
    known = _page_of({}, count, started, None, after, limit + 1) if status is None else None
    with (
        conn.pipeline(),
        conn.cursor() as troubled,
        conn.cursor(row_factory=dict_row) as cur,
    ):
        troubled.execute(ITEM_TROUBLE, params)
        if known is not None:
            rows = [f"{map_id}[{n}].{local}" for n in known[:limit] for local in body]
            cur.execute(ITEM_ROWS, {"id": execution_id, "rows": rows})
        trouble: dict[int, str] = {
            int(item[len(prefix) : -1]): item_status(set(statuses))
            for item, statuses in troubled.fetchall()
        }
        page = (
            known
            if known is not None
            else _page_of(trouble, count, started, status, after, limit + 1)
        )
        more = len(page) > limit
        page = page[:limit]
        if known is None:
            rows = [f"{map_id}[{n}].{local}" for n in page for local in body]
            cur.execute(ITEM_ROWS, {"id": execution_id, "rows": rows})
        by_id = {r["step_id"]: r for r in cur.fetchall()}
    counts = {str(s): 0 for s in ItemStatus}
    for value in trouble.values():
        counts[value] += 1
    counts[ItemStatus.SUCCEEDED] += max(started - len(trouble), 0)
    counts[ItemStatus.QUEUED] += max(count - started, 0)

    def status_of(index: int) -> str:
        found = trouble.get(index)
        if found is not None:
            return found
        return ItemStatus.SUCCEEDED if index < started else ItemStatus.QUEUED

    items = [
        {"index": n, "status": status_of(n), "steps": _item_steps(map_id, n, body, by_id)}
        for n in page
    ]
    return {
        "total": count,
        "counts": counts,
        "items": items,
        "next_after": page[-1] if more and page else None,
    }


def _item_steps(
    map_id: str, index: int, body: list[str], by_id: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One map item's steps, in body order: a step with no row yet shows as pending."""
    steps = []
    for local in body:
        r = by_id.get(f"{map_id}[{index}].{local}")
        steps.append(
            {
                "id": f"{map_id}[{index}].{local}",
                "status": r["status"] if r else "pending",
                "attempt_count": r["attempts"] if r else 0,
                "started_at": _iso(r["started_at"]) if r else None,
                "finished_at": _iso(r["finished_at"]) if r else None,
                "output": r["output"] if r else None,
                "error": r["error"] if r else None,
            }
        )
    return steps


def _page_of(
    trouble: dict[int, str], count: int, started: int, status: str | None, after: int, want: int
) -> list[int]:
    """Up to `want` item indexes after `after`, in order, of `status` (None: any); reads
    only the items that did not succeed, never every index of the map."""
    first = after + 1
    if status is None:
        return list(range(first, min(count, first + want)))
    if status == ItemStatus.SUCCEEDED:
        page: list[int] = []
        index = first
        while index < min(started, count) and len(page) < want:
            if index not in trouble:
                page.append(index)
            index += 1
        return page
    page = sorted(n for n, found in trouble.items() if found == status and n >= first)[:want]
    if status == ItemStatus.QUEUED:
        start = max(started, first)
        page += range(start, min(count, start + want - len(page)))
    return page


MAP_ROW = """
SELECT e.version_id, s.status, s.output FROM executions e
JOIN steps s ON s.execution_id = e.id AND s.step_id = %(map)s AND s.type = 'map'
WHERE e.id = %(id)s
"""


def map_page(
    conn: psycopg.Connection,
    execution_id: str,
    map_id: str,
    *,
    status: str | None,
    after: int,
    limit: int,
) -> dict[str, Any]:
    """A page of one map step's items (GET .../steps/{map}/items); NotFound when the
    execution has no such map."""
    row = conn.execute(MAP_ROW, {"id": execution_id, "map": map_id}).fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} has no map step {map_id!r}")
    version_id, map_status, output = row
    body = [sub.id for sub in definition_for(conn, version_id).step(map_id).body]
    return map_items(
        conn,
        execution_id,
        map_id,
        body,
        map_status,
        output,
        status=status,
        after=after,
        limit=limit,
    )


def execution_detail(conn: psycopg.Connection, execution_id: str) -> dict[str, Any]:
    """The execution with its steps, every attempt, and its event history; a map step
    carries its items' counts by status and a first page of them (map_items)."""
    # The five reads are sent before any is fetched: one round trip, not five.
    with (
        conn.pipeline(),
        conn.cursor(row_factory=dict_row) as cur,
        conn.cursor(row_factory=dict_row) as step_rows,
        conn.cursor(row_factory=dict_row) as attempt_rows,
        conn.cursor(row_factory=dict_row) as event_rows,
        conn.cursor() as attribute_rows,
    ):
        params = {"id": execution_id}
        cur.execute(EXECUTION, params)
        step_rows.execute(STEPS, params)
        attempt_rows.execute(ATTEMPTS, params)
        event_rows.execute(EVENTS, params)
        attribute_rows.execute(ATTRIBUTES, params)
        head = cur.fetchone()
        steps = step_rows.fetchall()
        attempts = attempt_rows.fetchall()
        events = event_rows.fetchall()
        attributes: dict[str, str] = dict(sorted(attribute_rows.fetchall()))
    if head is None:
        raise NotFound(f"execution {execution_id} does not exist")
    items = _first_item_pages(conn, execution_id, head["version_id"], steps)
    by_step: dict[str, list[dict[str, Any]]] = {}
    for a in attempts:
        by_step.setdefault(a["step_id"], []).append(_attempt_view(a))
    skipped_because = {
        e["step_id"]: (e["detail"] or {}).get("reason")
        for e in events
        if e["kind"] == "step.skipped"
    }
    links = (
        children.links(conn, execution_id) if any(s["type"] == "workflow" for s in steps) else []
    )
    return {
        "id": str(head["id"]),
        "workflow": head["workflow"],
        "version": head["version"],
        "status": head["status"],
        "trigger": head["trigger"],
        "idempotency_key": head["idempotency_key"],
        "priority": head["priority"],
        # docs/contract.md#search-attributes: what it can be found by ({} without any).
        "attributes": attributes,
        "input": head["input"],
        "created_at": _iso(head["created_at"]),
        "started_at": _iso(head["started_at"]),
        "finished_at": _iso(head["finished_at"]),
        "updated_at": _iso(head["updated_at"]),
        "cancel_requested_at": _iso(head["cancel_requested_at"]),
        # docs/contract.md#child-workflows: both directions of the link between a parent and its
        # children.
        "parent": None
        if head["parent_id"] is None
        else {"execution_id": str(head["parent_id"]), "step_id": head["parent_step"]},
        # The parent's id stays as recorded when retention deleted the parent (no foreign
        # key on it, like replay_of): the link is never silently dropped, and says so.
        "parent_deleted": head["parent_deleted"],
        "depth": head["depth"],
        "children": links,
        # Why it waits (docs/contract.md#child-workflows): the children its waiting workflow steps
        # wait for, and whether each one waits for an operator.
        "waiting_on_children": children.waiting_on(steps, links),
        "steps": [_step_view(s, skipped_because.get(s["step_id"]), by_step, items) for s in steps],
        "events": [
            {"at": _iso(e["at"]), "step": e["step_id"], "kind": e["kind"], "detail": e["detail"]}
            for e in events
        ],
        # docs/contract.md#slots, docs/contract.md#pause: its key's slot and queue, or why it is
        # paused.
        "flow_control": flowcontrol.flow_state(conn, execution_id),
    }


def _first_item_pages(
    conn: psycopg.Connection, execution_id: str, version_id: Any, steps: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Each map step's items' counts and first page (map_items), by step id; the
    definition is read only when the execution has a map step."""
    maps = {s["step_id"]: s for s in steps if s["type"] == "map"}
    items: dict[str, dict[str, Any]] = {}
    if maps:
        definition = definition_for(conn, version_id)
        for map_id, row in maps.items():
            items[map_id] = map_items(
                conn,
                execution_id,
                map_id,
                [sub.id for sub in definition.step(map_id).body],
                row["status"],
                row["output"],
            )
    return items


def _attempt_view(a: dict[str, Any]) -> dict[str, Any]:
    """One attempt as the execution's detail shows it."""
    return {
        "attempt": a["attempt"],
        "worker": a["worker"],
        "started_at": _iso(a["started_at"]),
        "finished_at": _iso(a["finished_at"]),
        "outcome": a["outcome"],
        "error": a["error"],
        "http_status": a["http_status"],
        "duration_ms": a["duration_ms"],
        "request": a["request"],
        "response": a["response"],
    }


def _step_view(
    s: dict[str, Any],
    skipped_because: Any,
    by_step: dict[str, list[dict[str, Any]]],
    items: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """One step as the execution's detail shows it: its attempts, why it was skipped, and
    for a map step its items' first page."""
    return {
        "id": s["step_id"],
        "type": s["type"],
        "status": s["status"],
        "attempt_count": s["attempts"],
        "wake_at": _iso(s["wake_at"]),
        "lease_owner": s["lease_owner"],
        "lease_expires_at": _iso(s["lease_expires_at"]),
        "started_at": _iso(s["started_at"]),
        "finished_at": _iso(s["finished_at"]),
        "output": s["output"],
        "error": s["error"],
        "skipped_because": skipped_because,
        "attempts": by_step.get(s["step_id"], []),
        **({"items": items[s["step_id"]]} if s["step_id"] in items else {}),
    }


def map_extent(status: str, output: Any) -> tuple[int, int | None]:
    """How many items a map has, and how many of them started (have rows), from what its
    output says: {"items": N, "started": M} while it runs or once it stopped, the list of
    results once it succeeded (every item started), nothing before it started. The
    started count is None for a map whose output does not say (it started before the
    output did): the caller counts its items' rows."""
    if isinstance(output, list):
        return len(output), len(output)
    if isinstance(output, dict) and isinstance(output.get("items"), int):
        started = output.get("started")
        return int(output["items"]), int(started) if isinstance(started, int) else None
    return 0, 0


def list_executions(conn: psycopg.Connection, query: ExecutionQuery) -> dict[str, Any]:
    """One page of executions, newest first, and the cursor of the next page.

    `status="needs_attention"` lists every execution that needs an operator
    (flowforge/store/attention.py). `since`/`until` bound the creation time (at or after, before):
    ids are UUIDv7, so a time range is an id range on the primary key.
    """
    after = decode_cursor(query.cursor) if query.cursor else None
    limit = query.limit
    if query.attributes:
        rows = _attribute_page(conn, query, after)
    else:
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                NEEDS_ATTENTION_PAGE if query.status == ExecutionStatus.NEEDS_ATTENTION else PAGE,
                {
                    "workflow": query.workflow,
                    "workflows": list(query.workflows) if query.workflows is not None else None,
                    "status": query.status,
                    "after": after,
                    "since": uuid_floor(query.since) if query.since else None,
                    "until": uuid_floor(query.until) if query.until else None,
                    "limit": limit,
                },
            ).fetchall()
    items = [
        {
            "id": str(r["id"]),
            "workflow": r["workflow"],
            "version": r["version"],
            "status": r["status"],
            "priority": r["priority"],
            "created_at": _iso(r["created_at"]),
            "started_at": _iso(r["started_at"]),
            "finished_at": _iso(r["finished_at"]),
        }
        for r in rows
    ]
    next_cursor = None
    if len(rows) == limit:
        last = rows[-1]
        next_cursor = encode_cursor(str(last["id"]))
    return {"items": items, "next_cursor": next_cursor}


def _attribute_page(
    conn: psycopg.Connection, query: ExecutionQuery, after: str | None
) -> list[dict[str, Any]]:
    """One page of a query with attributes, through search.page under its time bound
    (a filter too slow to answer is a 422, search.FilterTooExpensive)."""
    keys: list[str] | None = None
    if query.workflow is not None:
        allowed = query.workflows is None or query.workflow in query.workflows
        keys = [query.workflow] if allowed else []
    elif query.workflows is not None:
        keys = list(query.workflows)
    flt = search.Filter(
        statuses=(query.status,) if query.status else None,
        created_from=query.since,
        created_to=query.until,
        attributes=query.attributes,
    )
    with search.bounded(conn):
        if keys is not None:
            found = tuple(search.workflow_ids(conn, keys).values())
            flt = replace(flt, workflow_ids=found or (-1,))  # -1: matches nothing
        ids = [str(row["id"]) for row in search.page(conn, flt, limit=query.limit, after=after)]
    if not ids:
        return []
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(PAGE_OF_IDS, {"ids": ids}).fetchall()


def encode_cursor(execution_id: str) -> str:
    """An opaque cursor: clients pass it back, never build it."""
    return base64.urlsafe_b64encode(uuid.UUID(execution_id).bytes).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The execution id a cursor stands for; BadCursor when it was tampered with."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return str(uuid.UUID(bytes=raw))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise BadCursor("pass back a next_cursor this API returned") from exc
