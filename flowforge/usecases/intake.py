"""Webhook intake: one event becomes one durable execution, in one transaction.

The intake never talks to RabbitMQ. It writes the idempotency row, the execution, its
steps and the outbox rows of its root steps in one statement — atomic by
itself — and only then answers 202: what was acknowledged is in PostgreSQL, whatever
the broker is doing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from jsonschema import Draft202012Validator

from flowforge.cache import BoundedCache, Rechecks
from flowforge.domain import inputschema
from flowforge.domain.definitions import Definition, execution_priority
from flowforge.domain.model import (
    FLOW_CONTROL_ACTOR,
    KeyOrigin,
)
from flowforge.errors import Conflict, FlowForgeError, NotFound
from flowforge.store import archive, children, flowcontrol
from flowforge.store.creation import create_execution, uuid7, version_steps
from flowforge.store.db import notify_relay, one
from flowforge.store.runs import definition_for
from flowforge.trust import presets, sealing
from flowforge.usecases import actions

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
# The whole intake in one statement (creation.py); the relay's NOTIFY follows the commit
# (db.notify_relay).
CREATE_EXECUTION = create_execution()
# The same with the execution's search attributes (docs/contract.md#search-attributes).
CREATE_ATTRIBUTED = create_execution(attributes=True)
# Each read of an intake target from PostgreSQL (a cache miss, a re-check) is told to
# whoever counts them: the API subscribes its counter (api.create_app), so the store
# imports no observer.
_target_read_listeners: list[Callable[[], None]] = []


def listen_target_reads(listener: Callable[[], None]) -> None:
    """Call `listener` once per target read from the database (once per listener)."""
    if listener not in _target_read_listeners:
        _target_read_listeners.append(listener)


def target_read() -> None:
    """A workflow's or a source's intake target was read from the database."""
    for listener in _target_read_listeners:
        listener()


# The parameters every execution's intake shares unless its caller says otherwise.
INTAKE_PARAMS = {
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


# How often a signature the cached secrets do not verify may re-read a workflow's target
# (per workflow and API process; cache.Rechecks): a burst, then one per interval. The
# bound on what a flood of forged signatures costs the database, and on how long a secret
# added during such a flood can go unseen.
RECHECK_INTERVAL_S = 1.0
RECHECK_BURST = 5


class Targets:
    """Per-process cache of each workflow's target. Never trusted blindly: the intake
    statement re-checks it, so caching saves a round trip without ever pinning an old
    version or accepting a revoked secret (a revoked secret stops verifying at once)."""

    MAX_ENTRIES = 4096

    def __init__(self) -> None:
        self._cached: BoundedCache[tuple[str, str, bytes | None], Target] = BoundedCache(
            self.MAX_ENTRIES
        )
        self._rechecks: Rechecks[tuple[str, str, bytes | None]] = Rechecks(
            RECHECK_INTERVAL_S, RECHECK_BURST, self.MAX_ENTRIES
        )

    def recheck(
        self, conn: psycopg.Connection, key: str, encryption_key: bytes | None
    ) -> Target | None:
        """A fresh target after a signature the cached one did not verify, or None when
        this workflow's re-reads are used up for now (the refusal stands)."""
        if not self._rechecks.allow((conn.info.dbname, key, encryption_key)):
            return None
        return self.get(conn, key, encryption_key, fresh=True)

    def forget(self, conn: psycopg.Connection, key: str, encryption_key: bytes | None) -> None:
        """Drop a workflow's cached target after this process changed its secrets, so
        the next webhook here reads them whatever the recheck throttle says."""
        self._cached.discard((conn.info.dbname, key, encryption_key))

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
        target_read()
        target = _find_target(conn, key, encryption_key)
        self._cached.put(slot, target)
        return target


# This process's cache of intake targets (the webhook intake reads it; publishing and
# secret changes forget a workflow's entry after their commit).
TARGETS = Targets()


@dataclass(frozen=True)
class Accepted:
    """The answer to a webhook: the execution, and whether it already existed."""

    execution_id: str
    replayed: bool
    # A debounced or batched webhook: the group it was recorded against (grouping.py);
    # `execution_id` is then the group's execution, created when the group is due.
    group: dict[str, Any] | None = None


def unsigned_target(conn: psycopg.Connection, key: str) -> Target:
    """The target of an intake no webhook signed (a schedule's tick): the newest version,
    its signing secrets left sealed."""
    return _find_target(conn, key, None, open_secrets=False)


class UnsignedTargets:
    """A process's cache of unsigned targets (unsigned_target), for the intakes no webhook
    signed: schedule ticks and debounce/batch groups. Keyed by database too (one process
    may serve several); `fresh` reads past it after the workflow changed under a claim."""

    def __init__(self, size: int = 4096) -> None:
        self._cached: BoundedCache[tuple[str, str], Target] = BoundedCache(size)

    def get(self, conn: psycopg.Connection, key: str, fresh: bool = False) -> Target:
        slot = (conn.info.dbname, key)
        cached = None if fresh else self._cached.get(slot)
        if cached is None:
            cached = unsigned_target(conn, key)
            self._cached.put(slot, cached)
        return cached


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
    return Target(
        workflow_id,
        version_id,
        version,
        auth,
        tuple(zip(secret_ids, secret_values, strict=True)),
        definition,
        version_steps(definition, version),
        None if definition.input_schema is None else inputschema.validator(definition.input_schema),
    )


def priority_params(definition: Definition, body: bytes) -> dict[str, Any]:
    """The `priority` parameter of a new execution (docs/contract.md#priority): the definition's
    literal, or its template rendered against the body. Raises PriorityInvalid (422) for a value
    that is no priority, before any statement runs: nothing is stored."""
    if isinstance(definition.priority, int):
        return {"priority": definition.priority}
    return {"priority": execution_priority(definition, json.loads(body))}


def attribute_params(definition: Definition, body: bytes) -> dict[str, Any]:
    """The search attributes of a new execution (docs/contract.md#search-attributes):
    nothing, and no parse of the body, for a version that declares none."""
    if not definition.attributes:
        return {}
    return children.attribute_params(definition, json.loads(body))


def _execution_params(
    execution_id: str,
    target: Target,
    body: bytes,
    body_sha256: bytes,
    idempotency_key: str | None,
    secret_id: int | None,
    traceparent: str | None,
    *,
    headers: Mapping[str, str] | None,
    via: archive.Via | None,
    system: Mapping[str, Any] | None,
    origin: KeyOrigin,
) -> dict[str, Any]:
    """The parameters of the statements that create the execution (accept's arguments),
    worked out before anything is written."""
    return {
        "id": execution_id,
        "workflow_id": target.workflow_id,
        "version_id": target.version_id,
        "version": target.version,
        "secret_id": secret_id,
        # Already validated JSON: jsonb parses the raw text, no re-serialising in Python.
        "input": body.decode(),
        "key": idempotency_key,
        # A webhook's key is the client's, whatever it spells (docs/reference/security.md).
        "key_origin": origin.value,
        "body_sha256": body_sha256,
        **INTAKE_PARAMS,
        **target.steps,
        "traceparent": traceparent,
        **archive.intake_params(
            target.definition.archive_days if headers is not None else 0,
            body,
            headers or {},
            target.webhook_auth,
            via,
        ),
        **(system or {}),
        # Before anything is written: a priority that is no priority refuses the webhook.
        **priority_params(target.definition, body),
        **attribute_params(target.definition, body),
    }


def accept(
    conn: psycopg.Connection,
    target: Target,
    body: bytes,
    idempotency_key: str | None,
    secret_id: int | None,
    traceparent: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    via: archive.Via | None = None,
    system: Mapping[str, Any] | None = None,
    origin: KeyOrigin = KeyOrigin.CLIENT,
) -> Accepted:
    """Record a validated JSON body as an execution; replay or refuse a reused key.
    `traceparent` is the intake span's trace context (flowforge/observe/tracing.py), if traced.
    A webhook passes its `headers`: the workflow's archive keeps the ones that matter
    (archive.py); one routed through a source passes `via` too. A re-ingest passes
    `system` instead: the execution links to `system["delivery_id"]` with
    `system["event"]` as its first history entry (reingest.py). `origin` is the key's
    space: `client` for a sender's key, `system` for one FlowForge made (a source's
    delivery, a re-ingest; docs/reference/security.md, identity spaces).

    Raises StaleTarget when `target` is out of date; the caller looks it up afresh."""
    execution_id = str(uuid7())
    body_sha256 = hashlib.sha256(body).digest()
    params = _execution_params(
        execution_id,
        target,
        body,
        body_sha256,
        idempotency_key,
        secret_id,
        traceparent,
        headers=headers,
        via=via,
        system=system,
        origin=origin,
    )
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
            statement = CREATE_ATTRIBUTED if "attr_names" in params else CREATE_EXECUTION
            (current, created) = one(conn.execute(statement, params))
            if created:
                notify_relay(conn)
        if not current:
            raise StaleTarget(f"workflow {target.workflow_id} changed since it was cached")
        if created:
            if controlled:
                # on_full cancel_oldest: the new execution waits queued; the oldest holders
                # are cancelled as an operator cancel would, each in its own transaction (a
                # row lock is never waited for under the slot lock), and the first to be
                # terminal hands it its slot.
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


# One transaction of its own, committed with `level` (set_config(..., true): for this
# transaction only) and with a WAL record of its own (a transactional logical message),
# so its commit waits for a synchronous standby — and PostgreSQL confirms a commit there
# only together with all WAL before it, the intake's autocommitted statement included.
# The intake itself keeps committing without that wait on its NOTIFY-free path. Its COMMIT
# runs without a statement timeout: a timeout would cancel the wait and commit locally
# with only a warning, and the 202 would be given; the client's reply deadline ends the
# wait instead, with a 503.
REPLICATED = """
SELECT set_config('synchronous_commit', %(level)s, true),
       set_config('statement_timeout', '0', true),
       pg_logical_emit_message(true, 'flowforge', 'intake replicated')
"""


def replicate(conn: psycopg.Connection, level: str) -> None:
    """Return once what `conn` committed is as durable as `level` says (a synchronous
    standby has it, with `synchronous_standby_names` set): FLOWFORGE_SYNC_INTAKE."""
    with conn.transaction():
        conn.execute(REPLICATED, {"level": level})
