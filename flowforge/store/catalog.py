"""Publishing immutable workflow versions and reading them back."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from flowforge.domain.definitions import Definition, DefinitionInvalid, parse_definition
from flowforge.domain.model import WORKFLOW_KEY
from flowforge.domain.model import is_key as is_key  # callers may still ask catalog
from flowforge.errors import ClientError, Conflict, NotFound
from flowforge.store.db import one
from flowforge.trust import sealing, secret_bindings, signatures

# Always used with fullmatch: `$` would also match before a trailing newline.
KEY_PATTERN = WORKFLOW_KEY
MAX_ACTIVE_SECRETS = 2


class SecretInvalid(ClientError):
    """A supplied webhook secret the workflow could not verify with."""

    status = 422
    title = "Invalid secret"


# A /hooks/ name is a workflow key or a source name, never both (flowforge/store/sources.py):
# publish and source creation both claim the name under this lock first.
LOCK_HOOKS_NAME = "SELECT pg_advisory_xact_lock(hashtext('flowforge:hooks-name:' || %(name)s))"
SOURCE_NAMED = "SELECT 1 FROM sources WHERE name = %(name)s"
# Publishes of definitions with workflow steps (docs/contract.md#child-workflows) take turns, so
# that two which would close a cycle together (A calls B, B calls A) cannot both pass the check.
LOCK_COMPOSITION = "SELECT pg_advisory_xact_lock(hashtext('flowforge:composition'))"
# The workflows each workflow's newest version starts (archived ones start nothing).
CALLS = """
SELECT w.key, ARRAY(SELECT DISTINCT s->>'workflow'
                    FROM jsonb_array_elements(v.definition->'steps') AS s
                    WHERE s->>'type' = 'workflow' AND s->>'workflow' IS NOT NULL)
FROM workflows w
JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.latest_version
WHERE w.key = ANY(%(keys)s::text[]) AND w.archived_at IS NULL
"""
# How many workflows a cycle check reads at most: a bound on what one publish costs.
MAX_CALL_GRAPH = 1000
# Creates the workflow on first publish; otherwise bumps its version under the row lock
# the upsert takes, so concurrent publishers get distinct, gap-free version numbers.
BUMP_VERSION = """
INSERT INTO workflows (key, latest_version) VALUES (%(key)s, 1)
ON CONFLICT (key) DO UPDATE SET latest_version = workflows.latest_version + 1
RETURNING id, latest_version
"""
# `source` keeps the author's key order, which jsonb does not (sql/0024_definition_source.sql);
# a version is read from it where it exists.
INSERT_VERSION = """
INSERT INTO workflow_versions (workflow_id, version, name, definition, source, webhook_auth,
                               created_by)
VALUES (%(workflow_id)s, %(version)s, %(name)s, %(definition)s, %(source)s, %(webhook_auth)s,
        %(created_by)s)
RETURNING id, created_at
"""
# What starts a version's executions, in words: a schedule-only version has no webhook
# to authenticate, so its webhook_auth says nothing an operator needs.
_TRIGGER = """
CASE WHEN NOT coalesce(definition->'trigger' ? 'schedule', false) THEN 'webhook'
     WHEN definition->'trigger' ? 'webhook' THEN 'webhook, schedule'
     ELSE 'schedule' END"""
LIST_WORKFLOWS = f"""
SELECT w.key, w.latest_version, v.name, v.webhook_auth, w.created_at, v.created_at AS updated_at,
       {_TRIGGER} AS trigger
FROM workflows w JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.latest_version
WHERE w.key = ANY(%(keys)s) OR %(keys)s IS NULL
ORDER BY w.key
"""
GET_WORKFLOW = """
SELECT w.id, w.key, w.latest_version, w.created_at FROM workflows w WHERE w.key = %(key)s
"""
LIST_VERSIONS = f"""
SELECT version, name, webhook_auth, created_at, {_TRIGGER} AS trigger FROM workflow_versions
WHERE workflow_id = %(workflow_id)s ORDER BY version
"""
GET_VERSION = """
SELECT v.version, v.name, v.webhook_auth, coalesce(v.source, v.definition::json) AS definition,
       v.created_at
FROM workflow_versions v JOIN workflows w ON w.id = v.workflow_id
WHERE w.key = %(key)s AND v.version = %(version)s
"""
# Locks the workflow row so two creators cannot both pass the active-secret limit.
LOCK_WORKFLOW = "SELECT id FROM workflows WHERE key = %(key)s FOR UPDATE"
COUNT_ACTIVE_SECRETS = """
SELECT count(*) FROM webhook_secrets WHERE workflow_id = %(workflow_id)s AND revoked_at IS NULL
"""
# The id is drawn first because the sealed value is bound to it (associated data).
NEXT_SECRET_ID = "SELECT nextval(pg_get_serial_sequence('webhook_secrets', 'id'))"
INSERT_SECRET = """
INSERT INTO webhook_secrets (id, workflow_id, sealed) VALUES (%(id)s, %(workflow_id)s, %(sealed)s)
RETURNING created_at
"""
LIST_SECRETS = """
SELECT s.id, s.created_at, s.revoked_at FROM webhook_secrets s
JOIN workflows w ON w.id = s.workflow_id WHERE w.key = %(key)s ORDER BY s.id
"""
REVOKE_SECRET = """
UPDATE webhook_secrets s SET revoked_at = coalesce(s.revoked_at, now())
FROM workflows w WHERE w.id = s.workflow_id AND w.key = %(key)s AND s.id = %(id)s
RETURNING s.id
"""


# A definition without `trigger` is a signed webhook: until the workflow has a signing
# secret every webhook is refused with 401, which surprises whoever just left it out.
NO_TRIGGER_WARNING = (
    "this definition has no trigger, so its webhook requires a signature: every webhook is "
    "refused with 401 until the workflow has a signing secret (`flowforge secret create "
    '{key}`); to accept unsigned webhooks say "trigger": {{"webhook": {{"auth": "none"}}}}'
)


class SecretsForbidden(ClientError):
    """This API key may not publish definitions that use secrets."""

    status = 403
    title = "Forbidden"


def publishable(
    key: str,
    document: Any,
    bindings: secret_bindings.Bindings,
    *,
    may_use_secrets: bool = True,
) -> Definition:
    """The rule for what may be published, before anything is written (the API's publish
    and the CLI's on the box both ask it): a valid definition, secrets only from a
    publisher allowed them, and only secrets this environment binds to this workflow."""
    definition = parse_definition(document)
    uses = list(secret_bindings.references(document))
    if uses and not may_use_secrets:
        # Whoever publishes a request chooses where it goes, secrets included.
        raise SecretsForbidden(
            "this API key may not publish definitions that use secrets "
            "(create one with `flowforge apikey create --secrets`)"
        )
    secret_bindings.check(uses, key, bindings)
    return definition


def refuse_cycles(conn: psycopg.Connection, key: str, definition: Definition) -> None:
    """Refuse (422) a definition whose workflow steps would call it back
    (docs/contract.md#child-workflows): itself, or through the newest versions of the workflows they
    start. Each cycle is named by its path; what cannot be seen here (a workflow published later) is
    bounded at run time by FLOWFORGE_MAX_CHILD_DEPTH."""
    errors = []
    for index, step in enumerate(definition.steps):
        if step.workflow is None:
            continue
        path = _path_back(conn, key, step.workflow)
        if path is not None:
            errors.append(
                {
                    "path": f"$.steps[{index}].workflow",
                    "message": "cycle of workflows calling each other: "
                    + " -> ".join([key, *path]),
                }
            )
    if errors:
        raise DefinitionInvalid(errors)


def _path_back(conn: psycopg.Connection, key: str, first: str) -> list[str] | None:
    """The shortest chain of calls from `first` back to `key` (ending in `key`), if any."""
    came_from: dict[str, str | None] = {first: None}
    frontier = [first]
    while frontier and len(came_from) <= MAX_CALL_GRAPH:
        if key in came_from:
            break
        calls = conn.execute(CALLS, {"keys": frontier}).fetchall()
        frontier = []
        for caller, callees in calls:
            for callee in callees:
                if callee not in came_from:
                    came_from[callee] = caller
                    frontier.append(callee)
    if key not in came_from:
        return None
    path: list[str] = []
    at: str | None = key
    while at is not None:
        path.append(at)
        at = came_from[at]
    return path[::-1]


def list_workflows(conn: psycopg.Connection, keys: list[str] | None) -> list[dict[str, Any]]:
    """Every workflow (or those named) with its newest version."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(LIST_WORKFLOWS, {"keys": keys}).fetchall()
    return [
        {
            "workflow": r["key"],
            "latest_version": r["latest_version"],
            "name": r["name"],
            "webhook_auth": r["webhook_auth"],
            "trigger": r["trigger"],
            "created_at": r["created_at"].isoformat(),
            "updated_at": r["updated_at"].isoformat(),
        }
        for r in rows
    ]


def get_workflow(conn: psycopg.Connection, key: str) -> dict[str, Any]:
    """A workflow with the list of its versions."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(GET_WORKFLOW, {"key": key}).fetchone()
        if row is None:
            raise NotFound(f"workflow {key!r} does not exist")
        versions = cur.execute(LIST_VERSIONS, {"workflow_id": row["id"]}).fetchall()
    return {
        "workflow": row["key"],
        "latest_version": row["latest_version"],
        "created_at": row["created_at"].isoformat(),
        "versions": [
            {
                "version": v["version"],
                "name": v["name"],
                "webhook_auth": v["webhook_auth"],
                "trigger": v["trigger"],
                "created_at": v["created_at"].isoformat(),
            }
            for v in versions
        ],
    }


def get_version(conn: psycopg.Connection, key: str, version: int) -> dict[str, Any]:
    """One immutable version, definition included."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(GET_VERSION, {"key": key, "version": version}).fetchone()
    if row is None:
        raise NotFound(f"workflow {key!r} has no version {version}")
    return {
        "workflow": key,
        "version": row["version"],
        "name": row["name"],
        "webhook_auth": row["webhook_auth"],
        "input_schema": row["definition"].get("input_schema"),
        "definition": row["definition"],
        "created_at": row["created_at"].isoformat(),
    }


def unsigned_warning(conn: psycopg.Connection, key: str) -> str | None:
    """What to tell whoever adds a signing secret to a workflow that checks no signatures:
    a secret there protects nothing until a version without `auth: none` is published."""
    versions = get_workflow(conn, key)["versions"]
    if not versions or versions[-1]["webhook_auth"] != "none":
        return None
    return (
        f"workflow {key!r} accepts unsigned webhooks (its newest version has "
        '"auth": "none"); this secret is checked only after you publish a version '
        "without it"
    )


def check_supplied_secret(conn: psycopg.Connection, key: str, value: str) -> None:
    """Refuse (422) a supplied secret the newest version could never verify with: Standard
    Webhooks (`auth: signature`) secrets are `whsec_` + base64 of the key bytes."""
    versions = get_workflow(conn, key)["versions"]
    if versions and versions[-1]["webhook_auth"] == "signature" and not signatures.is_secret(value):
        raise SecretInvalid(
            f"workflow {key!r} checks Standard Webhooks signatures (auth signature): its "
            "secrets are whsec_ + base64; omit the body to have one made"
        )


def create_secret(
    conn: psycopg.Connection, key: str, secret: str, encryption_key: bytes | None
) -> dict[str, Any]:
    """Add a signing secret, stored sealed; refuse a third active one so rotation stays
    deliberate, and refuse any without an encryption key rather than store it in clear."""
    if encryption_key is None:
        raise sealing.EncryptionKeyMissing
    with conn.transaction():
        row = conn.execute(LOCK_WORKFLOW, {"key": key}).fetchone()
        if row is None:
            raise NotFound(f"workflow {key!r} does not exist")
        (active,) = one(conn.execute(COUNT_ACTIVE_SECRETS, {"workflow_id": row[0]}))
        if active >= MAX_ACTIVE_SECRETS:
            raise Conflict(
                f"workflow {key!r} already has {MAX_ACTIVE_SECRETS} active secrets; "
                "revoke one before creating another"
            )
        (secret_id,) = one(conn.execute(NEXT_SECRET_ID))
        sealed = sealing.seal(encryption_key, secret, row[0], secret_id)
        (created_at,) = one(
            conn.execute(INSERT_SECRET, {"id": secret_id, "workflow_id": row[0], "sealed": sealed})
        )
    return {"id": secret_id, "secret": secret, "created_at": created_at.isoformat()}


def list_secrets(conn: psycopg.Connection, key: str) -> list[dict[str, Any]]:
    """Signing secrets of a workflow, without their values."""
    rows = conn.execute(LIST_SECRETS, {"key": key}).fetchall()
    return [
        {
            "id": sid,
            "created_at": created.isoformat(),
            "revoked_at": revoked.isoformat() if revoked else None,
        }
        for sid, created, revoked in rows
    ]


def revoke_secret(conn: psycopg.Connection, key: str, secret_id: int) -> None:
    """Revoke a signing secret; takes effect on the next webhook."""
    if conn.execute(REVOKE_SECRET, {"key": key, "id": secret_id}).fetchone() is None:
        raise NotFound(f"workflow {key!r} has no webhook secret {secret_id}")


# docs/contract.md#pause: a workflow's pause (written by usecases/pausing.py), as its documents show
# it.
PAUSE_STATE = "SELECT paused_at, paused_by FROM workflows WHERE key = %(key)s"


def workflow_pause(conn: psycopg.Connection, key: str) -> dict[str, Any] | None:
    """Whether a workflow is paused: {since, by}, or None."""
    row = conn.execute(PAUSE_STATE, {"key": key}).fetchone()
    if row is None or row[0] is None:
        return None
    return {"since": row[0].isoformat(), "by": row[1]}
