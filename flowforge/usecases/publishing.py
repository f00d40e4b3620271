"""Publishing (docs/contract.md#definition): the next immutable version of a workflow and
the schedule it derives (docs/contract.md#schedules), decided in one transaction over
store/catalog.py and store/schedules.py.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Json, Jsonb

from flowforge.domain.definitions import Definition
from flowforge.errors import Conflict
from flowforge.store import schedules
from flowforge.store.catalog import (
    BUMP_VERSION,
    INSERT_VERSION,
    LOCK_COMPOSITION,
    LOCK_HOOKS_NAME,
    NO_TRIGGER_WARNING,
    SOURCE_NAMED,
    refuse_cycles,
)
from flowforge.store.db import one


def publish(
    conn: psycopg.Connection,
    key: str,
    document: Any,
    definition: Definition,
    created_by: int | None,
) -> dict[str, Any]:
    """Store the next immutable version of a workflow, creating the workflow if new."""
    with conn.transaction():
        conn.execute(LOCK_HOOKS_NAME, {"name": key})
        if conn.execute(SOURCE_NAMED, {"name": key}).fetchone():
            raise Conflict(f"{key!r} is a source; /hooks/{key} routes to its subscriptions")
        if definition.child_workflows():
            conn.execute(LOCK_COMPOSITION)
            refuse_cycles(conn, key, definition)
        workflow_id, version = one(conn.execute(BUMP_VERSION, {"key": key}))
        (version_id, created_at) = one(
            conn.execute(
                INSERT_VERSION,
                {
                    "workflow_id": workflow_id,
                    "version": version,
                    "name": definition.name,
                    "definition": Jsonb(document),
                    "source": Json(document),
                    "webhook_auth": definition.webhook_auth,
                    "created_by": created_by,
                },
            )
        )
        # The schedule follows the newest version, decided in this same transaction.
        schedules.derive(conn, workflow_id, version_id, document, definition)
    published = {
        "workflow": key,
        "version": version,
        "name": definition.name,
        "webhook_auth": definition.webhook_auth,
        "steps": [step.id for step in definition.steps],
        "created_at": created_at.isoformat(),
    }
    if isinstance(document, dict) and "trigger" not in document:
        published["warning"] = NO_TRIGGER_WARNING.format(key=key)
    return published
