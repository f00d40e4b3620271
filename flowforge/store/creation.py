"""Creating executions: the one builder of the statements that do it.

A webhook (intake.CREATE_EXECUTION), a webhook or tick of a flow-controlled workflow
(flowcontrol.GATED_INTAKE) and a batch of schedule ticks (schedules.BATCH_CLAIM,
BATCH_CREATE) each claim an idempotency key and write an execution, its steps (roots
ready), the roots' wake-ups and the first history entry. What they write is what Run.advance
would make of a new execution, in the engine's words (model.py), written here once as
literals of the enums: an execution `queued`, its root steps `ready`, the others
`pending`. They differ only in where the rows come from (one parameter set, or a jsonb
batch) and, when gated, in a decision (`mode`) that may queue, drop or replace; flow
control supplies that decision, this module the rest.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

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
ROOT_READY = f"CASE WHEN s.root THEN '{READY}' ELSE '{PENDING}' END"
READY_AT = "CASE WHEN s.root THEN now() END"
# The steps of the version, as the cached target carries them (intake.Target.steps).
# A child execution's own columns (create_execution(child=True)).
CHILD_COLUMNS = """,
                            parent_id, parent_step, depth, root_id, trigger, deadline_at,
                            expires_at"""
CHILD_VALUES = """,
           %(parent_id)s, %(parent_step)s, %(depth)s, %(root_id)s, 'workflow',
           now() + make_interval(secs => %(deadline_s)s::float8),
           now() + make_interval(secs => %(start_within_s)s::float8)"""
VERSION_STEPS = """unnest(%(step_ids)s::text[], %(types)s::text[], %(roots)s::bool[])
         WITH ORDINALITY AS s(step_id, type, root, position)"""


def create_execution(
    decision: str | None = None, replaced: str | None = None, *, child: bool = False
) -> str:
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
    so its parent's step has a child whose end it takes (children.start wakes it)."""
    gated = decision is not None
    if gated:
        # What a refused child becomes (a refused webhook or tick writes nothing).
        dropped = "mode IN ('drop', 'refuse')" if child else "mode = 'drop'"
        admitted = "true" if child else "mode <> 'refuse'"
        claim_from = "FROM current, decision WHERE %(key)s::text IS NOT NULL"
        claim_from += f" AND {admitted}"
        accepted = f"""SELECT mode FROM current, decision
    WHERE %(key)s::text IS NULL AND {admitted}
    UNION ALL SELECT mode FROM claim, decision"""
        child_columns = ", parent_id, parent_step, depth, root_id" if child else ""
        child_values = ", %(parent_id)s, %(parent_step)s, %(depth)s, %(root_id)s" if child else ""
        execution = f"""INSERT INTO executions (id, workflow_id, version_id, status, input,
                            idempotency_key, concurrency_key, slot_at, deadline_at,
                            expires_at, stop_reason, finished_at, trigger, traceparent,
                            delivery_id, priority{child_columns})
    SELECT %(id)s, %(workflow_id)s, %(version_id)s,
           CASE WHEN {dropped} THEN '{_CANCELLED}' ELSE '{QUEUED}' END,
           %(input)s::jsonb, %(key)s, %(ckey)s::text,
           CASE WHEN mode = 'start' AND %(ckey)s::text IS NOT NULL THEN now() END,
           now() + make_interval(secs => %(deadline_s)s::float8),
           now() + make_interval(secs => %(start_within_s)s::float8),
           CASE WHEN {dropped} THEN 'concurrency' END,
           CASE WHEN {dropped} THEN now() END,
           %(trigger)s, %(traceparent)s, {archive.DELIVERY_ID}, %(priority)s{child_values}
    FROM accepted"""
        steps = f"""INSERT INTO steps (execution_id, step_id, type, position, status, ready_at,
                       ready_since, error, finished_at, priority)
    SELECT %(id)s, s.step_id, s.type, s.position,
           CASE WHEN {dropped} THEN '{_STEP_CANCELLED}'
                WHEN s.root AND mode = 'start' THEN '{READY}'
                ELSE '{PENDING}' END,
           CASE WHEN s.root AND mode = 'start' THEN now() END,
           CASE WHEN s.root AND mode = 'start' THEN now() END,
           CASE WHEN mode = 'drop' THEN '{DROPPED_ERROR}'
                WHEN mode = 'refuse' THEN '{QUEUE_FULL_ERROR}' END,
           CASE WHEN {dropped} THEN now() END, %(priority)s
    FROM accepted,
         {VERSION_STEPS}"""
        woken = " WHERE mode = 'start'"
        history = f"""
    UNION ALL
    SELECT %(id)s, '{EventKind.SLOT_GRANTED}', jsonb_build_object('key', %(ckey)s::text)
    FROM accepted WHERE mode = 'start' AND %(ckey)s::text IS NOT NULL
    UNION ALL
    SELECT %(id)s, '{_DROPPED_KIND}', '{_DROPPED}'::jsonb
    FROM accepted WHERE {dropped}"""
        result = f""",
       (SELECT mode FROM decision),
       {replaced},
       EXISTS (SELECT FROM accepted WHERE mode = 'start')"""
    else:
        claim_from = "FROM current WHERE %(key)s::text IS NOT NULL"
        accepted = """SELECT 1 FROM current WHERE %(key)s::text IS NULL
    UNION ALL SELECT 1 FROM claim"""
        columns, values = (CHILD_COLUMNS, CHILD_VALUES) if child else ("", "")
        execution = f"""INSERT INTO executions (id, workflow_id, version_id, status, input,
                            idempotency_key, traceparent, delivery_id, priority{columns})
    SELECT %(id)s, %(workflow_id)s, %(version_id)s, '{QUEUED}', %(input)s::jsonb, %(key)s,
           %(traceparent)s, {archive.DELIVERY_ID}, %(priority)s{values}
    FROM accepted"""
        steps = f"""INSERT INTO steps (execution_id, step_id, type, position, status, ready_at,
                       ready_since, priority)
    SELECT %(id)s, s.step_id, s.type, s.position,
           {ROOT_READY},
           {READY_AT}, {READY_AT}, %(priority)s
    FROM accepted,
         {VERSION_STEPS}"""
        woken = history = result = ""
    return f"""
WITH current AS (
    {STILL_CURRENT}
){decision or ""}, claim AS (
    {CLAIM_KEY}
    SELECT %(workflow_id)s, %(key_origin)s, %(key)s, %(body_sha256)s, %(id)s
    {claim_from}
    {ON_CLAIMED}
    RETURNING 1
), accepted AS (
    {accepted}
), {archive.ARCHIVE_CTE}, execution AS (
    {execution}
), new_steps AS (
    {steps}
), wakeups AS (
    {INSERT_WAKEUPS}
    SELECT %(id)s, root FROM accepted, unnest(%(root_ids)s::text[]) AS root{woken}
), history AS (
    INSERT INTO execution_events (execution_id, kind, detail)
    SELECT %(id)s, '{QUEUED_KIND}', %(event)s::jsonb FROM accepted{history}
)
SELECT (SELECT count(*) FROM current), (SELECT count(*) FROM accepted){result}
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
