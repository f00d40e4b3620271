"""The console's reads of executions: a filtered, keyset-paged list, bounded counts per
status, the operator's attention inbox, and the selection a bulk action walks.

Every query here must answer in milliseconds on a table of millions of rows, so each one
is shaped for an index (sql/0013_console_sessions.sql): the list is a LATERAL per
(workflow, status) pair, each branch an index range scan newest first, merged and cut to
the page; a time range is an id range (ids are UUIDv7); counts stop at COUNT_CAP.
The WHERE clause of a branch is joined from the constant fragments below, chosen by which
filters are set (never from user input; the values are always parameters), so PostgreSQL
plans each combination with the index it needs instead of one plan full of `IS NULL OR`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flowforge.domain.definitions.bounds import MAX_ATTRIBUTES
from flowforge.domain.model import (
    LIVE_EXECUTION,
    TERMINAL_EXECUTION,
    ExecutionStatus,
    StepStatus,
    sql_list,
)
from flowforge.errors import ClientError, StatementCancelled
from flowforge.store.attention import BEYOND_THE_STATUS
from flowforge.store.db import wrap_exceptions

# `needs_attention` in a filter means what it means everywhere (flowforge/store/attention.py):
# the executions in that status and those of any other status with an unknown step. These
# are the latter, outside the statuses the filter names: few, found through steps_unknown.
_BEYOND_THE_STATUS = f"""
SELECT b.execution_id FROM ({BEYOND_THE_STATUS}) b
JOIN executions e ON e.id = b.execution_id WHERE e.status <> ALL(%(statuses)s::text[])
"""
# A count per status stops here: the list shows "1000+" rather than count a million rows.
COUNT_CAP = 1000
STATUSES = tuple(status.value for status in ExecutionStatus)

# An input value this common (matches in the first COMMON_INPUT rows the GIN index gives)
# is cheaper found by walking the id order and testing each row: the next page's matches
# are a few rows apart. A rarer one is cheaper from the GIN index, matches sorted. The
# planner cannot tell the two apart (jsonb containment has no statistics), so it is asked.
COMMON_INPUT = 2000
INPUT_PROBE = """
SELECT count(*) FROM (SELECT 1 FROM executions e WHERE e.input @> %(input)s LIMIT %(cap)s) x
"""
# For a common value: no bitmap scan (the whole GIN posting list), walk the indexes in order.
WALK_IN_ORDER = "SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off"
WORKFLOW_IDS = "SELECT id, key FROM workflows WHERE key = ANY(%(keys)s) ORDER BY key"

# A console list (its page, its counts, a bulk preview) gets this long in all; a filter
# that costs more is refused (FilterTooExpensive) rather than tying up an API process and
# a database connection until the API's own statement timeout.
LIST_TIMEOUT_MS = 2000
SET_LIST_TIMEOUT = "SELECT set_config('statement_timeout', %(ms)s, true)"

# The filter fragments of one branch; `w` and `s` are the branch's workflow and status.
_FRAGMENTS = {
    "workflow": "e.workflow_id = w.workflow_id",
    "status": "e.status = s.status",
    "idempotency_key": "e.idempotency_key = %(idempotency_key)s",
    "input": "e.input @> %(input)s",
    "created_from": "e.id >= %(id_from)s",
    "created_to": "e.id < %(id_to)s",
    "after": "e.id < %(after)s",
    "upto": "e.id <= %(upto)s",
    "id_prefix": "e.id BETWEEN %(id_lo)s AND %(id_hi)s",
    "ids": "e.id = ANY(%(ids)s::uuid[])",
}
# docs/contract.md#search-attributes: each attribute a filter names is a range of
# execution_attributes_lookup, the first as the ids it holds, each further one as a
# semi-join on the same index. Planned with their values (_prepare), the rarest drives the
# branch, newest id first, and the others are checked per row; a common one with a narrow
# workflow and status lets the executions' own index drive. Numbered by position in the
# filter, never by anything a request says.
MAX_FILTER_ATTRIBUTES = MAX_ATTRIBUTES
_FIRST_ATTRIBUTE = (
    "e.id IN (SELECT a.execution_id FROM execution_attributes a"
    " WHERE a.name = %(attr_name_0)s AND a.value = %(attr_value_0)s)"
)
_FRAGMENTS.update(
    {
        "attribute_0": _FIRST_ATTRIBUTE,
        **{
            f"attribute_{n}": f"EXISTS (SELECT 1 FROM execution_attributes a{n}"
            f" WHERE a{n}.execution_id = e.id AND a{n}.name = %(attr_name_{n})s"
            f" AND a{n}.value = %(attr_value_{n})s)"
            for n in range(1, MAX_FILTER_ATTRIBUTES)
        },
    }
)
# One page, newest first: each (workflow, status) branch yields its newest `limit` rows
# after the cursor, and the merge keeps the newest `limit` of those.
_PAGE = """
SELECT x.id, wf.key AS workflow, v.version, x.status, x.idempotency_key, x.created_at,
       x.finished_at
FROM unnest(%(workflow_ids)s::bigint[]) AS w(workflow_id)
CROSS JOIN unnest(%(statuses)s::text[]) AS s(status)
CROSS JOIN LATERAL (
    SELECT e.id, e.workflow_id, e.version_id, e.status, e.idempotency_key, e.created_at,
           e.finished_at
    FROM executions e WHERE {where} ORDER BY e.id DESC LIMIT %(limit)s
) x
JOIN workflows wf ON wf.id = x.workflow_id
JOIN workflow_versions v ON v.id = x.version_id
ORDER BY x.id DESC
LIMIT %(limit)s
"""
# How many executions of each status match, each (workflow, status) branch counting at
# most `cap` rows: `capped` says a count is a lower bound.
_COUNTS = """
SELECT s.status, sum(c.n)::bigint AS n, bool_or(c.n >= %(cap)s) AS capped
FROM unnest(%(workflow_ids)s::bigint[]) AS w(workflow_id)
CROSS JOIN unnest(%(statuses)s::text[]) AS s(status)
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (SELECT 1 FROM executions e WHERE {where} LIMIT %(cap)s) y
) c
GROUP BY s.status
"""
# "N changed since you loaded it" (docs/contract.md#live-progress): executions of the filter
# whose row changed after `since`. No index holds updated_at (one would cost every
# execution's every update), so the two ways a row changes are each read from an index
# that exists: a live one is found among the live (executions_by_status, few rows), a
# finished one by its finished_at (sql/0012's executions_finished and _keyed, per
# workflow). Each branch stops at `cap`.
_CHANGED_LIVE = f"""
SELECT count(*) FROM unnest(%(workflow_ids)s::bigint[]) AS w(workflow_id)
CROSS JOIN LATERAL (
    SELECT 1 FROM executions e
    WHERE e.status IN {sql_list(LIVE_EXECUTION)} AND e.status = ANY(%(statuses)s::text[])
      AND e.updated_at > %(since)s AND {{where}}
    LIMIT %(cap)s
) y
"""
_TERMINAL = sql_list(tuple(s for s in ExecutionStatus if s in TERMINAL_EXECUTION))
_CHANGED_FINISHED = f"""
SELECT count(*) FROM unnest(%(workflow_ids)s::bigint[]) AS w(workflow_id)
CROSS JOIN LATERAL (
    (SELECT 1 FROM executions e
     WHERE e.status IN {_TERMINAL} AND e.idempotency_key IS NULL
       AND e.status = ANY(%(statuses)s::text[]) AND e.finished_at > %(since)s AND {{where}}
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 1 FROM executions e
     WHERE e.status IN {_TERMINAL} AND e.idempotency_key IS NOT NULL
       AND e.status = ANY(%(statuses)s::text[]) AND e.finished_at > %(since)s AND {{where}}
     LIMIT %(cap)s)
) y
"""
ALL_WORKFLOW_IDS = "SELECT id FROM workflows ORDER BY id"
# The list's load time, on the clock updated_at and finished_at are written with.
DATABASE_NOW = "SELECT statement_timestamp()"
# The inbox: every step whose outcome is unknown (the partial index steps_unknown holds
# only those), whatever its execution's status, oldest execution first, with the last
# attempt: what was sent, by which worker, and when.
ATTENTION_STEPS = """
SELECT s.execution_id, s.step_id, s.type, s.error, e.status AS execution_status,
       wf.key AS workflow, v.version, v.definition, e.created_at, e.input,
       a.started_at AS sent_at, a.worker, a.error AS attempt_error, a.attempt,
       a.request AS sent, a.response
FROM steps s
JOIN executions e ON e.id = s.execution_id
JOIN workflows wf ON wf.id = e.workflow_id
JOIN workflow_versions v ON v.id = e.version_id
LEFT JOIN LATERAL (
    SELECT started_at, worker, error, attempt, request, response FROM attempts
    WHERE execution_id = s.execution_id AND step_id = s.step_id ORDER BY id DESC LIMIT 1
) a ON true
WHERE s.status = 'unknown'
  AND (%(workflows)s::text[] IS NULL OR wf.key = ANY(%(workflows)s))
ORDER BY s.execution_id, s.step_id
LIMIT %(limit)s
"""
# needs_attention executions with no unknown step left (an operator must still see them).
ATTENTION_EXECUTIONS = """
SELECT e.id, wf.key AS workflow, v.version, e.status, e.created_at
FROM executions e
JOIN workflows wf ON wf.id = e.workflow_id
JOIN workflow_versions v ON v.id = e.version_id
WHERE e.status = 'needs_attention'
  AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.execution_id = e.id AND s.status = 'unknown')
  AND (%(workflows)s::text[] IS NULL OR wf.key = ANY(%(workflows)s))
ORDER BY e.id
LIMIT %(limit)s
"""


# What the console's list shows beyond the page's own columns, read for the page's rows
# only (at most PAGE_SIZE primary-key lookups): how it started and its first step error,
# of a step that ended badly (a step that succeeded on a later try keeps the error of
# the try before, which is no error of the execution).
ENDED_BADLY = (StepStatus.FAILED, StepStatus.UNKNOWN)
LIST_EXTRAS = f"""
SELECT e.id, e.trigger, e.started_at,
       (SELECT s.error FROM steps s WHERE s.execution_id = e.id AND s.error IS NOT NULL
          AND s.status IN {sql_list(ENDED_BADLY)}
        ORDER BY s.position LIMIT 1) AS error
FROM executions e WHERE e.id = ANY(%(ids)s::uuid[])
"""
HEX_PREFIX = re.compile(r"[0-9a-f]{1,32}")


class FilterTooExpensive(ClientError):
    """The filter matched too little too slowly for the indexes to serve it in time."""

    status = 422
    title = "Filter too expensive"


@contextmanager
def bounded(conn: psycopg.Connection) -> Iterator[None]:
    """Run a console list's queries in one transaction under LIST_TIMEOUT_MS, and answer
    a filter that takes longer with FilterTooExpensive (a page saying to narrow it)."""
    try:
        with wrap_exceptions(), conn.transaction():
            conn.execute(SET_LIST_TIMEOUT, {"ms": str(LIST_TIMEOUT_MS)})
            yield
    except StatementCancelled:
        raise FilterTooExpensive(
            f"this filter takes longer than {LIST_TIMEOUT_MS / 1000:g} s to answer: narrow it"
            " (a workflow, a status, a time range, or a more specific input value)"
        ) from None


@dataclass(frozen=True)
class Filter:
    """What the executions list is narrowed to; None is "any"."""

    workflow_ids: tuple[int, ...] | None = None
    statuses: tuple[str, ...] | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    idempotency_key: str | None = None
    input_match: Any = None  # a containment document: {"customer": {"id": 42}}
    upto: str | None = None  # bulk actions: nothing newer than the preview's newest
    id_prefix: str | None = None  # hex digits an execution id starts with (dashes dropped)
    # (name, value) pairs an execution must all have (docs/contract.md#search-attributes).
    attributes: tuple[tuple[str, str], ...] = ()

    def narrowed(self, statuses: tuple[str, ...]) -> Filter:
        """The same filter, its statuses cut to `statuses` (an action's eligible ones)."""
        keep = tuple(s for s in (self.statuses or STATUSES) if s in statuses)
        return replace(self, statuses=keep)


def uuid_floor(instant: datetime) -> str:
    """The smallest UUIDv7 of an instant's millisecond: `id >= uuid_floor(t)` is
    "created at t or later", so a time range is an id range on the primary key."""
    millis = int(instant.timestamp() * 1000)
    return str(uuid.UUID(int=max(0, min(millis, 2**48 - 1)) << 80))


def id_prefix(text: str) -> str | None:
    """The hex digits of a full or partial execution id as typed (dashes and case
    ignored), or None when it cannot start an id."""
    digits = text.strip().lower().replace("-", "")
    return digits if HEX_PREFIX.fullmatch(digits) else None


def id_range(prefix: str) -> tuple[str, str]:
    """The lowest and highest id that start with `prefix`: a prefix is a range of the
    primary key, so a search by a pasted id prefix is one index range scan."""
    return (
        str(uuid.UUID(prefix.ljust(32, "0"))),
        str(uuid.UUID(prefix.ljust(32, "f"))),
    )


def extras(conn: psycopg.Connection, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The trigger, start and first step error of each listed execution, by id."""
    if not ids:
        return {}
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(LIST_EXTRAS, {"ids": ids}).fetchall()
    return {str(row["id"]): row for row in rows}


def workflow_ids(conn: psycopg.Connection, keys: list[str]) -> dict[str, int]:
    """The ids of the workflows named (those that exist)."""
    return {key: wid for wid, key in conn.execute(WORKFLOW_IDS, {"keys": keys})}


def _query(
    template: str, flt: Filter, extra: dict[str, Any], *, statuses: bool
) -> tuple[str, dict[str, Any]]:
    chosen = []
    if flt.workflow_ids is not None:
        chosen.append("workflow")
    if statuses:
        chosen.append("status")
    params: dict[str, Any] = {
        "workflow_ids": list(flt.workflow_ids) if flt.workflow_ids is not None else [None],
        **extra,
    }
    if flt.idempotency_key is not None:
        chosen.append("idempotency_key")
        params["idempotency_key"] = flt.idempotency_key
    if flt.input_match is not None:
        chosen.append("input")
        params["input"] = Jsonb(flt.input_match)
    if flt.created_from is not None:
        chosen.append("created_from")
        params["id_from"] = uuid_floor(flt.created_from)
    if flt.created_to is not None:
        chosen.append("created_to")
        params["id_to"] = uuid_floor(flt.created_to)
    if flt.id_prefix is not None:
        chosen.append("id_prefix")
        params["id_lo"], params["id_hi"] = id_range(flt.id_prefix)
    for n, (name, value) in enumerate(flt.attributes[:MAX_FILTER_ATTRIBUTES]):
        chosen.append(f"attribute_{n}")
        params[f"attr_name_{n}"], params[f"attr_value_{n}"] = name, value
    if flt.upto is not None:
        chosen.append("upto")
        params["upto"] = flt.upto
    if extra.get("after") is not None:
        chosen.append("after")
    if "ids" in extra:
        chosen.append("ids")
    where = " AND ".join(_FRAGMENTS[name] for name in chosen) or "true"
    return template.format(where=where), params


@contextmanager
def _planned(conn: psycopg.Connection, flt: Filter) -> Iterator[None]:
    """Run the queries of a filter with the plan its input value needs (COMMON_INPUT)."""
    if flt.input_match is None:
        yield
        return
    probe = {"input": Jsonb(flt.input_match), "cap": COMMON_INPUT}
    (found,) = conn.execute(INPUT_PROBE, probe).fetchone() or (0,)
    # Rolled back at the end (it only reads): the planner settings stop with it, also
    # inside an outer transaction (bounded), where a SET LOCAL would otherwise outlive it.
    with conn.transaction(force_rollback=True):
        if found >= COMMON_INPUT:
            conn.execute(WALK_IN_ORDER)
        yield


def _prepare(flt: Filter) -> bool | None:
    """Never a prepared statement for a filter by attributes: a generic plan cannot tell a
    rare value from a common one, and with two attributes it may walk the common one's
    range (half the table) to find the rare one's few rows. Planned with its values, the
    rarer drives (column statistics know `tier = gold` from `customer = 42`); planning
    costs well under a millisecond. None: psycopg's default for every other filter."""
    return False if flt.attributes else None


def _beyond_the_status(conn: psycopg.Connection, flt: Filter) -> list[str]:
    """The executions `needs_attention` in the filter adds beyond its statuses: those of
    another status with an unknown step (none when the filter names no such status)."""
    if flt.statuses is None or ExecutionStatus.NEEDS_ATTENTION not in flt.statuses:
        return []
    rows = conn.execute(_BEYOND_THE_STATUS, {"statuses": list(flt.statuses)}).fetchall()
    return [str(execution_id) for (execution_id,) in rows]


def page(
    conn: psycopg.Connection, flt: Filter, *, limit: int, after: str | None = None
) -> list[dict[str, Any]]:
    """Up to `limit` matching executions, newest first, older than `after` (an id)."""
    if flt.statuses == ():
        return []
    rows = _page(conn, flt, limit=limit, after=after)
    if beyond := _beyond_the_status(conn, flt):
        sql, params = _query(
            _PAGE,
            replace(flt, statuses=None),
            {"statuses": [None], "limit": limit, "after": after, "ids": beyond},
            statuses=False,
        )
        with conn.cursor(row_factory=dict_row) as cur:
            rows += cur.execute(sql, params, prepare=_prepare(flt)).fetchall()
        rows = sorted(rows, key=lambda row: str(row["id"]), reverse=True)[:limit]
    return rows


def _page(
    conn: psycopg.Connection, flt: Filter, *, limit: int, after: str | None
) -> list[dict[str, Any]]:
    sql, params = _query(
        _PAGE,
        flt,
        {
            "statuses": list(flt.statuses) if flt.statuses is not None else [None],
            "limit": limit,
            "after": after,
        },
        statuses=flt.statuses is not None,
    )
    with _planned(conn, flt), conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql, params, prepare=_prepare(flt)).fetchall()


def _counts(
    conn: psycopg.Connection,
    flt: Filter,
    statuses: tuple[str, ...],
    cap: int,
    *,
    apart: bool = False,
) -> dict[str, tuple[int, bool]]:
    """Per status; `apart`: each status on its own (the chips), so needs_attention also
    counts executions with an unknown step that another chip counts too; else the statuses
    together (a bulk action), each execution once."""
    sql, params = _query(_COUNTS, flt, {"statuses": list(statuses), "cap": cap}, statuses=True)
    found = dict.fromkeys(statuses, (0, False))
    with _planned(conn, flt):
        for status, n, capped in conn.execute(sql, params, prepare=_prepare(flt)).fetchall():
            found[status] = (n, capped)
    if ExecutionStatus.NEEDS_ATTENTION in found:
        # Counted as everywhere: also the executions of other statuses with an unknown
        # step, under the filter's other conditions.
        alone = (ExecutionStatus.NEEDS_ATTENTION.value,)
        if beyond := _beyond_the_status(conn, replace(flt, statuses=alone if apart else statuses)):
            sql, params = _query(
                _COUNTS,
                replace(flt, statuses=None),
                {"statuses": [None], "cap": cap, "ids": beyond},
                statuses=False,
            )
            with _planned(conn, flt):
                counted = conn.execute(sql, params, prepare=_prepare(flt)).fetchall()
                extra = sum(n for _, n, _ in counted)
            n, capped = found[ExecutionStatus.NEEDS_ATTENTION]
            found[ExecutionStatus.NEEDS_ATTENTION] = (n + extra, capped)
    return found


def status_counts(conn: psycopg.Connection, flt: Filter) -> dict[str, str]:
    """How many executions of each status match the filter's other conditions, as text:
    "12", or "1000+" once a count reached COUNT_CAP."""
    found = _counts(conn, flt, STATUSES, COUNT_CAP, apart=True)
    return {status: f"{n}+" if capped else str(n) for status, (n, capped) in found.items()}


def bulk_count(conn: psycopg.Connection, flt: Filter, cap: int) -> tuple[int, bool]:
    """How many executions of the filter's statuses match, and whether counting stopped
    at `cap` (per status) before the end."""
    found = _counts(conn, flt, flt.statuses or STATUSES, cap, apart=False)
    return sum(n for n, _ in found.values()), any(capped for _, capped in found.values())


def database_now(conn: psycopg.Connection) -> datetime:
    """The database's clock now (a page's load time, compared with its timestamps)."""
    (now,) = conn.execute(DATABASE_NOW).fetchone() or (None,)
    assert isinstance(now, datetime)
    return now


def changed_since(
    conn: psycopg.Connection, flt: Filter, since: datetime, cap: int
) -> tuple[int, bool]:
    """How many executions of the filter changed after `since` (created, moved on or
    finished), and whether counting stopped at `cap`."""
    if flt.statuses == ():
        return 0, False
    if flt.workflow_ids is None:
        ids = tuple(wid for (wid,) in conn.execute(ALL_WORKFLOW_IDS))
        flt = replace(flt, workflow_ids=ids or (-1,))
    extra = {"statuses": list(flt.statuses or STATUSES), "since": since, "cap": cap}
    found = 0
    with _planned(conn, flt):
        for template in (_CHANGED_LIVE, _CHANGED_FINISHED):
            sql, params = _query(template, flt, extra, statuses=False)
            (n,) = conn.execute(sql, params, prepare=_prepare(flt)).fetchone() or (0,)
            found += n
            if found >= cap:
                return cap, True
    return found, False


def attention(
    conn: psycopg.Connection, workflows: tuple[str, ...] | None, limit: int = 200
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The unknown steps (oldest first) and the needs_attention executions without one."""
    params = {"workflows": list(workflows) if workflows is not None else None, "limit": limit}
    with conn.cursor(row_factory=dict_row) as cur:
        steps = cur.execute(ATTENTION_STEPS, params).fetchall()
        executions = cur.execute(ATTENTION_EXECUTIONS, params).fetchall()
    return steps, executions
