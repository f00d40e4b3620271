"""Webhook intake: one event becomes one durable execution, in one transaction.

The intake never talks to RabbitMQ. It writes the idempotency row, the execution, its
steps and the outbox rows of its root steps in one statement — atomic by
itself — and only then answers 202: what was acknowledged is in PostgreSQL, whatever
the broker is doing.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from jsonschema import Draft202012Validator

from flowforge import actions, archive, flowcontrol, inputschema, metrics, presets, sealing
from flowforge.cache import BoundedCache
from flowforge.db import notify_relay, one
from flowforge.definitions import Definition
from flowforge.errors import Conflict, FlowForgeError, NotFound
from flowforge.model import (
    FLOW_CONTROL_ACTOR,
    ExecutionStatus,
    KeyOrigin,
    StepStatus,
    execution_event,
)
from flowforge.outbox import INSERT_WAKEUPS
from flowforge.runs import definition_for

# The newest published version and the active signing secrets (ids and sealed values;
# a secret still in clear from before migration 0004 is unusable until bin/migrate seals it).
LATEST_VERSION = """
SELECT w.id, v.id, v.version, v.webhook_auth,
       ARRAY(SELECT s.id FROM webhook_secrets s
             WHERE s.workflow_id = w.id AND s.revoked_at IS NULL AND s.sealed IS NOT NULL
             ORDER BY s.id),
       ARRAY(SELECT s.sealed FROM webhook_secrets s
             WHERE s.workflow_id = w.id AND s.revoked_at IS NULL AND s.sealed IS NOT NULL
             ORDER BY s.id)
FROM workflows w
JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.latest_version
WHERE w.key = %(key)s AND w.archived_at IS NULL
"""
# The whole intake in one statement, hence one implicit transaction and one round trip.
# `current` proves the caller's cached target is still true — the version is still the
# newest and the secret that signed the webhook is still active — so an execution always
# pins the newest version and a revoked secret starts nothing. Then: claim the
# idempotency key (race-safe: of concurrent inserts of one key exactly one wins, the
# others wait for it and get no row) and, only if it was claimed or there is none, write
# the execution, its steps (roots ready), the root wake-ups and the first event; the
# relay's NOTIFY follows the commit (db.notify_relay). The statuses and the event
# kind written are the engine's (model.py), passed as parameters (INTAKE_PARAMS): an
# execution `queued`, its root steps `ready`, the others `pending` — what Run.advance
# would make of them.
CREATE_EXECUTION = f"""
WITH current AS (
    {flowcontrol.STILL_CURRENT}
), claim AS (
    INSERT INTO idempotency_keys (workflow_id, origin, key, body_sha256, execution_id)
    SELECT %(workflow_id)s, %(key_origin)s, %(key)s, %(body_sha256)s, %(id)s
    FROM current WHERE %(key)s::text IS NOT NULL
    ON CONFLICT (workflow_id, origin, key) DO NOTHING
    RETURNING 1
), accepted AS (
    SELECT 1 FROM current WHERE %(key)s::text IS NULL
    UNION ALL SELECT 1 FROM claim
), {archive.ARCHIVE_CTE}, execution AS (
    INSERT INTO executions (id, workflow_id, version_id, status, input, idempotency_key,
                            traceparent, delivery_id)
    SELECT %(id)s, %(workflow_id)s, %(version_id)s, %(queued)s, %(input)s::jsonb, %(key)s,
           %(traceparent)s, {archive.DELIVERY_ID}
    FROM accepted
), new_steps AS (
    INSERT INTO steps (execution_id, step_id, type, position, status, ready_at)
    SELECT %(id)s, s.step_id, s.type, s.position,
           CASE WHEN s.root THEN %(ready)s ELSE %(pending)s END,
           CASE WHEN s.root THEN now() END
    FROM accepted,
         unnest(%(step_ids)s::text[], %(types)s::text[], %(roots)s::bool[])
         WITH ORDINALITY AS s(step_id, type, root, position)
), wakeups AS (
    {INSERT_WAKEUPS}
    SELECT %(id)s, root FROM accepted, unnest(%(root_ids)s::text[]) AS root
), history AS (
    INSERT INTO execution_events (execution_id, kind, detail)
    SELECT %(id)s, %(queued_kind)s, %(event)s::jsonb FROM accepted
)
SELECT (SELECT count(*) FROM current), (SELECT count(*) FROM accepted)
"""
INTAKE_PARAMS = {
    "queued": ExecutionStatus.QUEUED.value,
    "queued_kind": execution_event(ExecutionStatus.QUEUED),
    "ready": StepStatus.READY.value,
    "pending": StepStatus.PENDING.value,
    "traceparent": None,  # a schedule tick's execution roots its own trace (tracing.py)
    **archive.NO_ARCHIVE,
}
EXISTING_KEY = """
SELECT body_sha256, execution_id FROM idempotency_keys
WHERE workflow_id = %(workflow_id)s AND origin = %(key_origin)s AND key = %(key)s
"""


@dataclass(frozen=True)
class Target:
    """What a webhook for one workflow key will be pinned to."""

    workflow_id: int
    version_id: int
    version: int
    webhook_auth: str
    secrets: tuple[tuple[int, str], ...]  # (id, value) of each active signing secret
    definition: Definition
    # The version's part of the intake parameters, built once per cached target: step ids
    # are validated identifiers, so they are safe as array literals.
    steps: dict[str, str] = field(compare=False, repr=False)
    # The version's input_schema, compiled once per cached target (None: no schema).
    input_checker: Draft202012Validator | None = field(default=None, compare=False, repr=False)


class StaleTarget(FlowForgeError):
    """A cached target is no longer true: a newer version, a revoked secret, archived."""


class Targets:
    """Per-process cache of each workflow's target. Never trusted blindly: the intake
    statement re-checks it, so caching saves a round trip without ever pinning an old
    version or accepting a revoked secret."""

    MAX_ENTRIES = 4096

    def __init__(self) -> None:
        self._cached: BoundedCache[tuple[str, str, bytes | None], Target] = BoundedCache(
            self.MAX_ENTRIES
        )

    def get(
        self,
        conn: psycopg.Connection,
        key: str,
        encryption_key: bytes | None,
        *,
        fresh: bool = False,
    ) -> Target:
        """The cached target of a workflow key, or a fresh one read from the database
        (its signing secrets opened with `encryption_key`)."""
        # Keyed by database and encryption key too: one process may serve several apps
        # (the test suite does), and secrets opened with one key must not serve another.
        slot = (conn.info.dbname, key, encryption_key)
        if not fresh:
            cached = self._cached.get(slot)
            if cached is not None:
                return cached
        target = _find_target(conn, key, encryption_key)
        metrics.INTAKE_TARGET_READS.inc()
        self._cached.put(slot, target)
        return target


@dataclass(frozen=True)
class Accepted:
    """The answer to a webhook: the execution, and whether it already existed."""

    execution_id: str
    replayed: bool


def uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7): new executions land on the rightmost
    pages of the primary keys instead of random ones, which keeps inserts cheap when the
    tables hold millions of rows."""
    millis = time.time_ns() // 1_000_000
    value = (millis & (2**48 - 1)) << 80 | int.from_bytes(os.urandom(10)) & (2**80 - 1)
    value = value & ~(0xF << 76) | (0x7 << 76)  # version 7
    value = value & ~(0x3 << 62) | (0x2 << 62)  # RFC 4122 variant
    return uuid.UUID(int=value)


def unsigned_target(conn: psycopg.Connection, key: str) -> Target:
    """The target of an intake no webhook signed (a schedule's tick): the newest version,
    its signing secrets left sealed."""
    return _find_target(conn, key, None, open_secrets=False)


def _find_target(
    conn: psycopg.Connection, key: str, encryption_key: bytes | None, *, open_secrets: bool = True
) -> Target:
    """The newest published version of a workflow, or NotFound. Signing secrets are opened
    only when the workflow checks signatures; one that does not open fails the lookup
    (SecretUnreadable) rather than quietly narrowing what verifies."""
    row = conn.execute(LATEST_VERSION, {"key": key}).fetchone()
    if row is None:
        raise NotFound(f"workflow {key!r} does not exist")
    workflow_id, version_id, version, auth, secret_ids, sealed_values = row
    secret_values = []
    if auth in presets.SIGNED and open_secrets:
        secret_values = [
            sealing.unseal(encryption_key, sealed, workflow_id, secret_id)
            for secret_id, sealed in zip(secret_ids, sealed_values, strict=True)
        ]
    else:
        secret_ids = []
    definition = definition_for(conn, version_id)
    roots = set(definition.roots())
    steps = definition.steps
    return Target(
        workflow_id,
        version_id,
        version,
        auth,
        tuple(zip(secret_ids, secret_values, strict=True)),
        definition,
        {
            "step_ids": "{" + ",".join(s.id for s in steps) + "}",
            "types": "{" + ",".join(s.type for s in steps) + "}",
            "roots": "{" + ",".join("t" if s.id in roots else "f" for s in steps) + "}",
            "root_ids": "{" + ",".join(s.id for s in steps if s.id in roots) + "}",
            "event": json.dumps({"to": ExecutionStatus.QUEUED.value, "version": version}),
        },
        None if definition.input_schema is None else inputschema.validator(definition.input_schema),
    )


def accept(
    conn: psycopg.Connection,
    target: Target,
    body: bytes,
    idempotency_key: str | None,
    secret_id: int | None,
    traceparent: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    system: Mapping[str, Any] | None = None,
) -> Accepted:
    """Record a validated JSON body as an execution; replay or refuse a reused key.
    `traceparent` is the intake span's trace context (flowforge/tracing.py), if traced.
    A webhook passes its `headers`: the workflow's archive keeps the ones that matter
    (archive.py). A re-ingest passes `system` instead — its key is then in the system's
    key space, and the execution links to `system["delivery_id"]` with `system["event"]`
    as its first history entry (reingest.py).

    Raises StaleTarget when `target` is out of date; the caller looks it up afresh."""
    execution_id = str(uuid7())
    body_sha256 = hashlib.sha256(body).digest()
    params = {
        "id": execution_id,
        "workflow_id": target.workflow_id,
        "version_id": target.version_id,
        "version": target.version,
        "secret_id": secret_id,
        # Already validated JSON: jsonb parses the raw text, no re-serialising in Python.
        "input": body.decode(),
        "key": idempotency_key,
        # A webhook's key is the client's, whatever it spells (SPEC §12).
        "key_origin": KeyOrigin.CLIENT.value,
        "body_sha256": body_sha256,
        **INTAKE_PARAMS,
        **target.steps,
        "traceparent": traceparent,
        **archive.intake_params(
            target.definition.archive_days if headers is not None else 0,
            body,
            headers or {},
            target.webhook_auth,
        ),
        **(system or {}),
    }
    controlled = flowcontrol.is_controlled(target.definition)
    if controlled:
        params.update(flowcontrol.intake_params(target.definition, body))
    # Twice at most: a key forgotten by housekeeping between the two statements is free.
    for _ in range(2):
        refused: flowcontrol.QueueFull | None = None
        if controlled:
            try:
                decision = flowcontrol.create(conn, params)
                current, created = decision.current, decision.created
            except flowcontrol.QueueFull as exc:
                refused, current, created = exc, True, False
        else:
            (current, created) = one(conn.execute(CREATE_EXECUTION, params))
            if created:
                notify_relay(conn)
        if not current:
            raise StaleTarget(f"workflow {target.workflow_id} changed since it was cached")
        if created:
            if controlled:
                # on_full cancel_oldest: the new execution holds a slot already; the oldest
                # holders are cancelled as an operator cancel would, each in its own
                # transaction (a row lock is never waited for under the slot lock).
                actions.stop_replaced(conn, decision.replaced, actor=FLOW_CONTROL_ACTOR)
            return Accepted(execution_id, replayed=False)
        existing = conn.execute(EXISTING_KEY, params).fetchone() if idempotency_key else None
        if existing is None and refused is not None:
            raise refused
        if existing is not None:
            existing_sha, existing_id = existing
            if existing_sha != body_sha256:
                raise Conflict("this idempotency key was already used with a different body")
            return Accepted(str(existing_id), replayed=True)
    raise Conflict("this idempotency key is being reused concurrently; try again")
