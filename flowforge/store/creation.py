"""Creating executions: the one builder of the statements that do it.

A webhook (intake.CREATE_EXECUTION), a webhook or tick of a flow-controlled workflow
(flowcontrol.GATED_INTAKE) and a batch of schedule ticks (schedules.BATCH_CLAIM, then
BATCH_CREATE here) each claim an idempotency key and write an execution, its steps (roots
ready), the roots' wake-ups and the first history entry. What they write is what Run.advance
would make of a new execution, in the engine's words (model.py), written here once as
literals of the enums: an execution `queued`, its root steps `ready`, the others
`pending`. They differ only in where the rows come from (one parameter set, or a jsonb
batch) and, when gated, in a decision (`mode`) that may queue, drop or replace; flow
control supplies that decision, this module the rest. A replay's execution row is inserted
here too (CREATE_REPLAY), its steps and history by the replay.

Every INSERT INTO executions lives here (tests/unit/test_execution_builder.py), named or
composed with psycopg.sql from named parts: the parts differ per caller, never per request,
and nothing here is spliced from a string a request supplies.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

from psycopg import sql

from flowforge.domain.model import (
    EventKind,
    ExecutionStatus,
    StepStatus,
    execution_event,
    transition,
)
from flowforge.store import archive
from flowforge.store.outbox import INSERT_WAKEUPS

if TYPE_CHECKING:
    from flowforge.domain.definitions import Definition

QUEUED = ExecutionStatus.QUEUED.value
READY, PENDING = StepStatus.READY.value, StepStatus.PENDING.value
QUEUED_KIND = execution_event(ExecutionStatus.QUEUED)
# A dropped execution (on_full drop_new) is recorded `queued -> cancelled`, reason
# concurrency, its steps cancelled.
_CANCELLED, _STEP_CANCELLED = ExecutionStatus.CANCELLED.value, StepStatus.CANCELLED.value
_DROPPED_KIND = execution_event(ExecutionStatus.CANCELLED)
_DROPPED = json.dumps({**transition(QUEUED, _CANCELLED), "reason": "concurrency"})
# What the steps of a dropped execution say; a refused child's (a full queue) say the other.
DROPPED_ERROR = "not run: concurrency limit reached (on_full drop_new)"
QUEUE_FULL_ERROR = "not run: the queue of the workflow is full (concurrency.max_queued)"

# The target is still what the per-process cache says: the version is the newest and the
# signing secret that matched is not revoked.
STILL_CURRENT = """SELECT 1 FROM workflows w
    WHERE w.id = %(workflow_id)s AND w.latest_version = %(version)s AND w.archived_at IS NULL
      AND (%(secret_id)s::bigint IS NULL OR EXISTS (
          SELECT 1 FROM webhook_secrets s WHERE s.id = %(secret_id)s AND s.revoked_at IS NULL))"""
# The claim of an idempotency key, followed by the SELECT of its rows: race-safe, of
# concurrent inserts of one key exactly one wins, the others wait for it and get no row.
CLAIM_KEY = "INSERT INTO idempotency_keys (workflow_id, origin, key, body_sha256, execution_id)"
ON_CLAIMED = "ON CONFLICT (workflow_id, origin, key) DO NOTHING"
# A new step's status and ready time, from whether it is a root (`s.root`).
ROOT_READY = sql.SQL("CASE WHEN s.root THEN {} ELSE {} END").format(
    sql.Literal(READY), sql.Literal(PENDING)
)
READY_AT = sql.SQL("CASE WHEN s.root THEN now() END")
# The steps of the version, as the cached target carries them (intake.Target.steps).
VERSION_STEPS = sql.SQL("""unnest(%(step_ids)s::text[], %(types)s::text[], %(roots)s::bool[])
         WITH ORDINALITY AS s(step_id, type, root, position)""")
# A child execution's own columns (create_execution(child=True)); a gated child takes
# its deadlines from the gated columns.
CHILD_COLUMNS = sql.SQL(""",
                            parent_id, parent_step, depth, root_id, trigger, deadline_at,
                            expires_at""")
CHILD_VALUES = sql.SQL(""",
           %(parent_id)s, %(parent_step)s, %(depth)s, %(root_id)s, 'workflow',
           now() + make_interval(secs => %(deadline_s)s::float8),
           now() + make_interval(secs => %(start_within_s)s::float8)""")
GATED_CHILD_COLUMNS = sql.SQL(", parent_id, parent_step, depth, root_id")
GATED_CHILD_VALUES = sql.SQL(", %(parent_id)s, %(parent_step)s, %(depth)s, %(root_id)s")
# The rows of one execution, not gated: queued, its roots ready now.
EXECUTION = sql.SQL("""INSERT INTO executions (id, workflow_id, version_id, status, input,
                            idempotency_key, traceparent, delivery_id, priority{columns})
    SELECT %(id)s, %(workflow_id)s, %(version_id)s, {queued}, %(input)s::jsonb, %(key)s,
           %(traceparent)s, {delivery_id}, %(priority)s{values}
    FROM accepted""")
STEPS = sql.SQL("""INSERT INTO steps (execution_id, step_id, type, position, status, ready_at,
                       ready_since, priority)
    SELECT %(id)s, s.step_id, s.type, s.position,
           {root_ready},
           {ready_at}, {ready_at}, %(priority)s
    FROM accepted,
         {version_steps}""")
# The rows of one gated execution, as its `mode` decides (`dropped`: written cancelled).
GATED_EXECUTION = sql.SQL("""INSERT INTO executions (id, workflow_id, version_id, status, input,
                            idempotency_key, concurrency_key, slot_at, deadline_at,
                            expires_at, stop_reason, finished_at, trigger, traceparent,
                            delivery_id, priority{columns})
    SELECT %(id)s, %(workflow_id)s, %(version_id)s,
           CASE WHEN {dropped} THEN {cancelled} ELSE {queued} END,
           %(input)s::jsonb, %(key)s, %(ckey)s::text,
           CASE WHEN mode = 'start' AND %(ckey)s::text IS NOT NULL THEN now() END,
           now() + make_interval(secs => %(deadline_s)s::float8),
           now() + make_interval(secs => %(start_within_s)s::float8),
           CASE WHEN {dropped} THEN 'concurrency' END,
           CASE WHEN {dropped} THEN now() END,
           %(trigger)s, %(traceparent)s, {delivery_id}, %(priority)s{values}
    FROM accepted""")
GATED_STEPS = sql.SQL("""INSERT INTO steps (execution_id, step_id, type, position, status, ready_at,
                       ready_since, error, finished_at, priority)
    SELECT %(id)s, s.step_id, s.type, s.position,
           CASE WHEN {dropped} THEN {step_cancelled}
                WHEN s.root AND mode = 'start' THEN {ready}
                ELSE {pending} END,
           CASE WHEN s.root AND mode = 'start' THEN now() END,
           CASE WHEN s.root AND mode = 'start' THEN now() END,
           CASE WHEN mode = 'drop' THEN {dropped_error}
                WHEN mode = 'refuse' THEN {queue_full_error} END,
           CASE WHEN {dropped} THEN now() END, %(priority)s
    FROM accepted,
         {version_steps}""")
GATED_HISTORY = sql.SQL("""
    UNION ALL
    SELECT %(id)s, {slot_granted}, jsonb_build_object('key', %(ckey)s::text)
    FROM accepted WHERE mode = 'start' AND %(ckey)s::text IS NOT NULL
    UNION ALL
    SELECT %(id)s, {dropped_kind}, {dropped_detail}::jsonb
    FROM accepted WHERE {dropped}""")
GATED_RESULT = sql.SQL(""",
       (SELECT mode FROM decision),
       {replaced},
       EXISTS (SELECT FROM accepted WHERE mode = 'start')""")
# What a refused child becomes (a refused webhook or tick writes nothing).
GATED_ACCEPTED = sql.SQL("""SELECT mode FROM current, decision
    WHERE %(key)s::text IS NULL AND {admitted}
    UNION ALL SELECT mode FROM claim, decision""")
CLAIM_FROM = sql.SQL("FROM current WHERE %(key)s::text IS NOT NULL")
GATED_CLAIM_FROM = sql.SQL("FROM current, decision WHERE %(key)s::text IS NOT NULL AND {admitted}")
ACCEPTED = sql.SQL("""SELECT 1 FROM current WHERE %(key)s::text IS NULL
    UNION ALL SELECT 1 FROM claim""")
# The whole statement: each {part} is one of the above, gated or not.
CREATE = sql.SQL("""
WITH current AS (
    {still_current}
){decision}, claim AS (
    {claim_key}
    SELECT %(workflow_id)s, %(key_origin)s, %(key)s, %(body_sha256)s, %(id)s
    {claim_from}
    {on_claimed}
    RETURNING 1
), accepted AS (
    {accepted}
), {archive}, execution AS (
    {execution}
), new_steps AS (
    {steps}
), wakeups AS (
    {insert_wakeups}
    SELECT %(id)s, root FROM accepted, unnest(%(root_ids)s::text[]) AS root{woken}
), history AS (
    INSERT INTO execution_events (execution_id, kind, detail)
    SELECT %(id)s, {queued_kind}, %(event)s::jsonb FROM accepted{history}
){attributes}
SELECT (SELECT count(*) FROM current), (SELECT count(*) FROM accepted){result}
""")
_EMPTY = sql.SQL("")
# docs/contract.md#search-attributes: the attributes rendered at intake
# (intake.attribute_params), written with the execution; only in the statement of an intake
# that has some, so a version without attributes runs the statement it always ran.
ATTRIBUTES = sql.SQL(""", attributes AS (
    INSERT INTO execution_attributes (execution_id, name, value)
    SELECT %(id)s, a.name, a.value
    FROM accepted, unnest(%(attr_names)s::text[], %(attr_values)s::text[]) AS a(name, value)
)""")


def create_execution(
    decision: str | None = None,
    replaced: str | None = None,
    *,
    child: bool = False,
    attributes: bool = False,
) -> sql.Composed:
    """The statement that creates one execution from one parameter set: one implicit
    transaction and one round trip.

    `current` proves the caller's cached target is still true, so an execution always
    pins the newest version and a revoked secret starts nothing. Then the key is claimed
    (when there is one) and, only if it was claimed or there is none, the rows are
    written. It returns whether the target was current and whether it created.

    Gated (flow control, docs/contract.md#flow-control): `decision` holds the CTEs that end in
    `decision(mode)` — `start` (roots ready now), `queue` (steps pending until a slot frees), `drop`
    (recorded cancelled), `replace` (queued; the caller cancels the holders it replaces),
    `refuse` (nothing is written at all) — and `replaced` the array of holders a
    `replace` cancels; it also returns the mode, those holders and whether it woke a
    step.

    `child` (docs/contract.md#child-workflows): the execution a workflow step starts, which names
    its parent (`parent_id`, `parent_step`), its `depth` and the root of its tree (`root_id`), has
    the trigger `workflow`, and takes its version's deadline_s and start_within_s (`deadline_s`,
    `start_within_s`). A gated child is never `refuse`d without a trace: a full queue
    (max_queued) writes it like a `drop`, cancelled with reason concurrency and saying why,
    so its parent's step has a child whose end it takes (children.start wakes it).

    `attributes` (docs/contract.md#search-attributes): also the execution's search attributes,
    from the arrays `attr_names` and `attr_values`."""
    parts = _gated(decision, replaced or "NULL", child) if decision else _plain(child)
    return CREATE.format(
        still_current=sql.SQL(STILL_CURRENT),
        claim_key=sql.SQL(CLAIM_KEY),
        on_claimed=sql.SQL(ON_CLAIMED),
        archive=sql.SQL(archive.ARCHIVE_CTE),
        insert_wakeups=sql.SQL(INSERT_WAKEUPS),
        queued_kind=sql.Literal(QUEUED_KIND),
        attributes=ATTRIBUTES if attributes else _EMPTY,
        **parts,
    )


def _plain(child: bool) -> dict[str, sql.Composable]:
    """The parts of an execution without flow control: always queued, roots ready."""
    columns, values = (CHILD_COLUMNS, CHILD_VALUES) if child else (_EMPTY, _EMPTY)
    execution = EXECUTION.format(
        columns=columns,
        values=values,
        queued=sql.Literal(QUEUED),
        delivery_id=sql.SQL(archive.DELIVERY_ID),
    )
    steps = STEPS.format(root_ready=ROOT_READY, ready_at=READY_AT, version_steps=VERSION_STEPS)
    return {
        "decision": _EMPTY,
        "claim_from": CLAIM_FROM,
        "accepted": ACCEPTED,
        "execution": execution,
        "steps": steps,
        "woken": _EMPTY,
        "history": _EMPTY,
        "result": _EMPTY,
    }


def _gated(decision: str, replaced: str, child: bool) -> dict[str, sql.Composable]:
    """The parts of a gated execution, written as the `decision`'s mode says."""
    dropped = sql.SQL("mode IN ('drop', 'refuse')" if child else "mode = 'drop'")
    admitted = sql.SQL("true" if child else "mode <> 'refuse'")
    columns, values = (GATED_CHILD_COLUMNS, GATED_CHILD_VALUES) if child else (_EMPTY, _EMPTY)
    execution = GATED_EXECUTION.format(
        columns=columns,
        values=values,
        dropped=dropped,
        cancelled=sql.Literal(_CANCELLED),
        queued=sql.Literal(QUEUED),
        delivery_id=sql.SQL(archive.DELIVERY_ID),
    )
    steps = GATED_STEPS.format(
        dropped=dropped,
        step_cancelled=sql.Literal(_STEP_CANCELLED),
        ready=sql.Literal(READY),
        pending=sql.Literal(PENDING),
        dropped_error=sql.Literal(DROPPED_ERROR),
        queue_full_error=sql.Literal(QUEUE_FULL_ERROR),
        version_steps=VERSION_STEPS,
    )
    history = GATED_HISTORY.format(
        slot_granted=sql.Literal(EventKind.SLOT_GRANTED.value),
        dropped_kind=sql.Literal(_DROPPED_KIND),
        dropped_detail=sql.Literal(_DROPPED),
        dropped=dropped,
    )
    return {
        "decision": sql.SQL(decision),
        "claim_from": GATED_CLAIM_FROM.format(admitted=admitted),
        "accepted": GATED_ACCEPTED.format(admitted=admitted),
        "execution": execution,
        "steps": steps,
        "woken": sql.SQL(" WHERE mode = 'start'"),
        "history": history,
        "result": GATED_RESULT.format(replaced=sql.SQL(replaced)),
    }


# A batch of schedule ticks, claimed already (schedules.BATCH_CLAIM): the executions (a
# gated one holding its slot), their steps (roots ready), the root wake-ups and the history
# (the relay is notified after the commit, Scheduling.decide_due). Two statements rather
# than one: joining the claim's RETURNING back to its input inside one statement is a
# nested loop over two CTEs the planner cannot size (quadratic in the batch). Every tick
# not claimed is left to the caller, which decides it through the full intake (a refusal,
# a buffer, a replace, a replay, a stale target).
BATCH_CREATE = sql.SQL("""
WITH accepted AS (
    SELECT * FROM jsonb_to_recordset(%(ticks)s::jsonb)
        AS t(id uuid, workflow_id bigint, version_id bigint, key text, input jsonb,
             ckey text, deadline_s float8, start_within_s float8, priority smallint)
), version AS (
    SELECT * FROM jsonb_to_recordset(%(versions)s::jsonb)
        AS v(version_id bigint, event jsonb, steps text[], types text[], roots bool[])
), step AS (
    SELECT v.version_id, s.step_id, s.type, s.root, s.position
    FROM version v, unnest(v.steps, v.types, v.roots) WITH ORDINALITY
        AS s(step_id, type, root, position)
), execution AS (
    INSERT INTO executions (id, workflow_id, version_id, status, input, idempotency_key,
                            concurrency_key, slot_at, deadline_at, expires_at, trigger,
                            priority)
    SELECT id, workflow_id, version_id, {queued}, input, key, ckey,
           CASE WHEN ckey IS NOT NULL THEN now() END,
           now() + make_interval(secs => deadline_s),
           now() + make_interval(secs => start_within_s),
           'schedule', priority
    FROM accepted
), new_steps AS (
    INSERT INTO steps (execution_id, step_id, type, position, status, ready_at, ready_since,
                       priority)
    SELECT a.id, s.step_id, s.type, s.position,
           {root_ready},
           {ready_at}, {ready_at}, a.priority
    FROM accepted a JOIN step s ON s.version_id = a.version_id
), wakeups AS (
    {insert_wakeups}
    SELECT a.id, s.step_id FROM accepted a JOIN step s ON s.version_id = a.version_id
    WHERE s.root
), history AS (
    INSERT INTO execution_events (execution_id, kind, detail)
    SELECT a.id, {queued_kind}, v.event FROM accepted a JOIN version v USING (version_id)
    UNION ALL
    SELECT id, {slot_granted}, jsonb_build_object('key', ckey)
    FROM accepted WHERE ckey IS NOT NULL
)
SELECT count(*) FROM accepted
""").format(
    queued=sql.Literal(QUEUED),
    root_ready=ROOT_READY,
    ready_at=READY_AT,
    insert_wakeups=sql.SQL(INSERT_WAKEUPS),
    queued_kind=sql.Literal(QUEUED_KIND),
    slot_granted=sql.Literal(EventKind.SLOT_GRANTED.value),
)


# A replay's new execution (usecases/replay.py, docs/contract.md#replay): the original's
# workflow and input on the target version, linked to it, its steps written by the replay.
CREATE_REPLAY = """
INSERT INTO executions (id, workflow_id, version_id, status, input, trigger, replay_of,
                        replay_from, concurrency_key, deadline_at, priority)
SELECT %(id)s, workflow_id, %(version_id)s, %(queued)s, input, 'replay', id, %(from_step)s,
       %(ckey)s, now() + make_interval(secs => %(deadline_s)s::float8), %(priority)s
FROM executions WHERE id = %(original)s
"""

# A replay's search attributes (docs/contract.md#search-attributes): its version's, rendered
# from the original's input, run only when there are some.
INSERT_ATTRIBUTES = """
INSERT INTO execution_attributes (execution_id, name, value)
SELECT %(id)s, a.name, a.value
FROM unnest(%(attr_names)s::text[], %(attr_values)s::text[]) AS a(name, value)
"""


def uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7): new executions land on the rightmost
    pages of the primary keys instead of random ones, which keeps inserts cheap when the
    tables hold millions of rows."""
    millis = time.time_ns() // 1_000_000
    value = (millis & (2**48 - 1)) << 80 | int.from_bytes(os.urandom(10)) & (2**80 - 1)
    value = value & ~(0xF << 76) | (0x7 << 76)  # version 7
    value = value & ~(0x3 << 62) | (0x2 << 62)  # RFC 4122 variant
    return uuid.UUID(int=value)


def version_steps(definition: Definition, version: int) -> dict[str, Any]:
    """A version's part of the creation parameters (VERSION_STEPS, the roots' wake-ups,
    the first history entry). Step ids are validated identifiers, so they are safe as
    array literals."""
    roots = set(definition.roots())
    steps = definition.steps
    return {
        "step_ids": "{" + ",".join(s.id for s in steps) + "}",
        "types": "{" + ",".join(s.type for s in steps) + "}",
        "roots": "{" + ",".join("t" if s.id in roots else "f" for s in steps) + "}",
        "root_ids": "{" + ",".join(s.id for s in steps if s.id in roots) + "}",
        "event": json.dumps({"to": ExecutionStatus.QUEUED.value, "version": version}),
    }
