"""Sources (docs/contract.md#sources routing): one `/hooks/<source>` endpoint whose subscriptions
start executions of several workflows, each chosen by a filter in the condition language of
`when` (path, op, value), combined with `all` or `any`, over `input.*` (the JSON body)
and `headers.*` (header names in lower case, e.g. `headers.x-github-event`).

The namespace: a source's name and a workflow key share `/hooks/`. Creating a source
whose name is a workflow key is refused, and so is publishing a workflow whose key is a
source (catalog.publish), both under one advisory lock on the name, so a name is never
both and `/hooks/<name>` always means one thing.

An event is authenticated once with the source's own secrets and preset (presets.py);
then, in one transaction, the source's cached copy is proven current (revision, the
signing secret still active), the delivery's identity is claimed in source_deliveries
(per source and delivery, never per subscription), and every matching subscription gets
its execution through intake.accept, keyed `source:<name>:<delivery id>` in the system's
key space (docs/reference/security.md, identity spaces: no client key can claim it).
A redelivery answers the routing recorded for its identity, whatever its headers say
now: a header no signature covers cannot re-route a captured delivery. An event that
matches nothing is answered 202 with no execution and kept in source_unmatched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg

from flowforge.domain import templating
from flowforge.domain.definitions import OPS, DefinitionInvalid
from flowforge.domain.jsonvalues import is_number
from flowforge.domain.model import WebhookAuth, is_key
from flowforge.errors import Conflict, NotFound
from flowforge.store import catalog
from flowforge.store.db import one
from flowforge.trust import sealing

MAX_SUBSCRIPTIONS = 50
MAX_CONDITIONS = 20

WORKFLOW_EXISTS = "SELECT 1 FROM workflows WHERE key = %(name)s"
# How a subscribed workflow's newest version authenticates its own webhooks.
WORKFLOW_AUTH = """
SELECT v.webhook_auth FROM workflows w
JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.latest_version
WHERE w.key = %(name)s
"""
UPSERT_SOURCE = """
INSERT INTO sources (name, auth, subscriptions) VALUES (%(name)s, %(auth)s, %(subscriptions)s)
ON CONFLICT (name) DO UPDATE SET auth = excluded.auth, subscriptions = excluded.subscriptions,
    revision = sources.revision + 1, updated_at = now()
RETURNING id, revision, created_at, updated_at
"""
GET_SOURCE = """
SELECT s.id, s.name, s.auth, s.subscriptions, s.revision, s.created_at, s.updated_at,
       ARRAY(SELECT k.id FROM source_secrets k
             WHERE k.source_id = s.id AND k.revoked_at IS NULL ORDER BY k.id),
       ARRAY(SELECT k.sealed FROM source_secrets k
             WHERE k.source_id = s.id AND k.revoked_at IS NULL ORDER BY k.id)
FROM sources s WHERE s.name = %(name)s
"""
LOCK_SOURCE = "SELECT id FROM sources WHERE name = %(name)s FOR UPDATE"
COUNT_ACTIVE = """
SELECT count(*) FROM source_secrets WHERE source_id = %(id)s AND revoked_at IS NULL
"""
NEXT_SECRET_ID = "SELECT nextval(pg_get_serial_sequence('source_secrets', 'id'))"
INSERT_SECRET = """
INSERT INTO source_secrets (id, source_id, sealed) VALUES (%(id)s, %(source_id)s, %(sealed)s)
RETURNING created_at
"""
# A change of the source counts as a change of its secrets too: revision is bumped so
# that a cached copy holding the revoked secret is no longer current.
REVOKE_SECRET = """
WITH revoked AS (
    UPDATE source_secrets k SET revoked_at = coalesce(k.revoked_at, now())
    FROM sources s WHERE s.id = k.source_id AND s.name = %(name)s AND k.id = %(id)s
    RETURNING k.source_id
)
UPDATE sources SET revision = revision + 1 WHERE id IN (SELECT source_id FROM revoked)
RETURNING id
"""
BUMP_REVISION = "UPDATE sources SET revision = revision + 1 WHERE id = %(id)s"
# Proves a cached source current in the routing transaction; FOR SHARE holds back a
# change (or a revocation) until the executions are committed.
STILL_CURRENT = """
SELECT 1 FROM sources s WHERE s.id = %(id)s AND s.revision = %(revision)s
  AND (%(secret_id)s::bigint IS NULL OR EXISTS (
      SELECT 1 FROM source_secrets k WHERE k.id = %(secret_id)s AND k.revoked_at IS NULL))
FOR SHARE OF s
"""
RECORD_UNMATCHED = """
INSERT INTO source_unmatched (source_id, identity, input)
VALUES (%(source_id)s, %(identity)s, %(input)s::jsonb)
ON CONFLICT (source_id, identity) WHERE identity IS NOT NULL DO NOTHING
"""

# A delivery's identity, claimed in the routing transaction: of concurrent deliveries of
# one identity the first claims it and the others wait for its commit, then read its
# routing (DELIVERY_ROUTED). The routing is recorded once the executions exist.
CLAIM_DELIVERY = """
INSERT INTO source_deliveries (source_id, identity, body_sha256)
VALUES (%(source_id)s, %(identity)s, %(body_sha256)s)
ON CONFLICT (source_id, identity) DO NOTHING
RETURNING 1
"""
DELIVERY_ROUTED = """
SELECT body_sha256, routed FROM source_deliveries
WHERE source_id = %(source_id)s AND identity = %(identity)s
"""
RECORD_ROUTED = """
UPDATE source_deliveries SET routed = %(routed)s::jsonb
WHERE source_id = %(source_id)s AND identity = %(identity)s
"""

# An unsigned source would let anyone start a workflow whose own webhooks must be signed.
DOWNGRADE = (
    "this workflow takes only signed webhooks; an unsigned source (auth none) cannot start it"
)


@dataclass(frozen=True)
class Subscription:
    name: str
    workflow: str
    filter: dict[str, Any] | None


@dataclass(frozen=True)
class Source:
    id: int
    name: str
    auth: str
    revision: int
    subscriptions: tuple[Subscription, ...]
    secrets: tuple[tuple[int, str], ...]  # (id, value) of each active signing secret


class StaleSource(Exception):
    """A cached source or workflow target is no longer true; look again."""


def parse(document: Any) -> tuple[str, list[dict[str, Any]]]:
    """Validate a source definition (422 with every problem's path); return its auth and
    its subscriptions as stored, each with a name (the workflow key unless given)."""
    errors: list[dict[str, str]] = []
    if not isinstance(document, dict):
        raise DefinitionInvalid([{"path": "$", "message": "a source is an object"}])
    for key in document:
        if key not in ("auth", "subscriptions"):
            errors.append({"path": f"$.{key}", "message": "allowed: auth, subscriptions"})
    auth = document.get("auth", "signature")
    if not isinstance(auth, str) or auth not in set(WebhookAuth):
        errors.append({"path": "$.auth", "message": f"one of {', '.join(sorted(WebhookAuth))}"})
    raw = document.get("subscriptions")
    stored: list[dict[str, Any]] = []
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_SUBSCRIPTIONS:
        errors.append({"path": "$.subscriptions", "message": f"an array of 1-{MAX_SUBSCRIPTIONS}"})
        raw = []
    names: set[str] = set()
    for index, sub in enumerate(raw):
        path = f"$.subscriptions[{index}]"
        if not isinstance(sub, dict):
            errors.append({"path": path, "message": "an object with workflow and filter"})
            continue
        for key in sub:
            if key not in ("name", "workflow", "filter"):
                errors.append(
                    {"path": f"{path}.{key}", "message": "allowed: name, workflow, filter"}
                )
        workflow = sub.get("workflow")
        if not isinstance(workflow, str) or not is_key(workflow):
            errors.append({"path": f"{path}.workflow", "message": "a workflow key"})
            continue
        name = sub.get("name", workflow)
        if not isinstance(name, str) or not is_key(name) or name in names:
            errors.append({"path": f"{path}.name", "message": "a unique name like a key"})
            continue
        names.add(name)
        if "filter" in sub:
            errors += _filter_problems(sub["filter"], f"{path}.filter")
        stored.append({"name": name, "workflow": workflow, "filter": sub.get("filter")})
    if errors:
        raise DefinitionInvalid(errors)
    return str(auth), stored


def _filter_problems(raw: Any, path: str) -> list[dict[str, str]]:
    """A filter is {"all": [conditions]} or {"any": [conditions]}; each condition is a
    `when` (path, op, value) whose path starts with input. or headers."""
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in ("all", "any"):
        return [{"path": path, "message": 'a filter is {"all": [...]} or {"any": [...]}'}]
    combinator, conditions = next(iter(raw.items()))
    path = f"{path}.{combinator}"
    if not isinstance(conditions, list) or not 1 <= len(conditions) <= MAX_CONDITIONS:
        return [{"path": path, "message": f"an array of 1-{MAX_CONDITIONS} conditions"}]
    problems = []
    for index, cond in enumerate(conditions):
        where = f"{path}[{index}]"
        if not isinstance(cond, dict) or set(cond) - {"path", "op", "value"}:
            problems.append({"path": where, "message": "a condition has path, op, value"})
            continue
        target, op = cond.get("path"), cond.get("op")
        if (
            not isinstance(target, str)
            or not templating.is_path(target)
            or target.split(".")[0] not in ("input", "headers")
        ):
            problems.append({"path": f"{where}.path", "message": "input.<...> or headers.<name>"})
        if op not in OPS:
            problems.append({"path": f"{where}.op", "message": f"one of {', '.join(OPS)}"})
        elif op != "exists" and "value" not in cond:
            problems.append({"path": f"{where}.value", "message": f"required for op {op!r}"})
        elif op == "in" and not isinstance(cond["value"], list):
            problems.append({"path": f"{where}.value", "message": "an array for op 'in'"})
        elif op in ("gt", "gte", "lt", "lte") and not (
            is_number(cond["value"]) or isinstance(cond["value"], str)
        ):
            problems.append({"path": f"{where}.value", "message": "a number or a string"})
    return problems


def matches(filter_: dict[str, Any] | None, context: dict[str, Any]) -> bool:
    """Whether an event's context ({"input", "headers"}) passes a subscription's filter;
    a path the event lacks fails its condition (unless the op is exists)."""
    if filter_ is None:
        return True
    combinator, conditions = next(iter(filter_.items()))
    results = (_holds(condition, context) for condition in conditions)
    return all(results) if combinator == "all" else any(results)


def _holds(condition: dict[str, Any], context: dict[str, Any]) -> bool:
    try:
        return templating.evaluate_condition(condition, context)
    except templating.TemplateError:
        return False


def save(
    conn: psycopg.Connection, name: str, auth: str, subs: list[dict[str, Any]]
) -> dict[str, Any]:
    """Create or replace a source; refuse a name that is a workflow key (409) and
    subscriptions to workflows that do not exist (422)."""
    with conn.transaction():
        conn.execute(catalog.LOCK_HOOKS_NAME, {"name": name})
        if conn.execute(WORKFLOW_EXISTS, {"name": name}).fetchone():
            raise Conflict(f"{name!r} is a workflow key; /hooks/{name} already starts it")
        problems = []
        for index, sub in enumerate(subs):
            row = conn.execute(WORKFLOW_AUTH, {"name": sub["workflow"]}).fetchone()
            path = f"$.subscriptions[{index}].workflow"
            if row is None:
                problems.append({"path": path, "message": "no such workflow"})
            elif auth == WebhookAuth.NONE and row[0] != WebhookAuth.NONE:
                problems.append({"path": path, "message": DOWNGRADE})
        if problems:
            raise DefinitionInvalid(problems)
        row = one(
            conn.execute(
                UPSERT_SOURCE, {"name": name, "auth": auth, "subscriptions": json.dumps(subs)}
            )
        )
    return {"source": name, "auth": auth, "subscriptions": subs, "revision": row[1]}


def show(conn: psycopg.Connection, name: str) -> dict[str, Any]:
    row = conn.execute(GET_SOURCE, {"name": name}).fetchone()
    if row is None:
        raise NotFound(f"source {name!r} does not exist")
    return {
        "source": row[1],
        "auth": row[2],
        "subscriptions": row[3],
        "revision": row[4],
        "created_at": row[5].isoformat(),
        "updated_at": row[6].isoformat(),
        "active_secrets": list(row[7]),
    }


def create_secret(
    conn: psycopg.Connection, name: str, value: str, encryption_key: bytes | None
) -> dict[str, Any]:
    """Add a sealed signing secret to a source (at most two active, as for workflows)."""
    if encryption_key is None:
        raise sealing.EncryptionKeyMissing
    with conn.transaction():
        row = conn.execute(LOCK_SOURCE, {"name": name}).fetchone()
        if row is None:
            raise NotFound(f"source {name!r} does not exist")
        (active,) = one(conn.execute(COUNT_ACTIVE, {"id": row[0]}))
        if active >= catalog.MAX_ACTIVE_SECRETS:
            raise Conflict(f"source {name!r} already has {active} active secrets; revoke one")
        (secret_id,) = one(conn.execute(NEXT_SECRET_ID))
        sealed = sealing.seal(encryption_key, value, row[0], secret_id, "source_secrets")
        (created_at,) = one(
            conn.execute(INSERT_SECRET, {"id": secret_id, "source_id": row[0], "sealed": sealed})
        )
        conn.execute(BUMP_REVISION, {"id": row[0]})
    return {"id": secret_id, "created_at": created_at.isoformat()}


def revoke_secret(conn: psycopg.Connection, name: str, secret_id: int) -> None:
    if conn.execute(REVOKE_SECRET, {"name": name, "id": secret_id}).fetchone() is None:
        raise NotFound(f"source {name!r} has no secret {secret_id}")
