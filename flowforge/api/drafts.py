"""The dry-run publish: a draft definition checked exactly as publishing checks it, with
nothing published (docs/reference/http-api.md). The console's editor asks it as the author
types; `flowforge apply` can ask it for every file before it publishes any.

Valid: 200 with what the draft would change against the newest version (domain/defdiff.py)
and its steps as a graph for a preview. Invalid: the same 422 problem, with each error's
JSON path, that publishing the draft would answer."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify

from flowforge.api.auth import authorize, key_required, requires
from flowforge.api.bodies import json_body
from flowforge.api.pool import connection
from flowforge.domain import defdiff
from flowforge.domain.definitions import Definition
from flowforge.domain.roles import Access
from flowforge.errors import Forbidden, NotFound
from flowforge.store import catalog
from flowforge.store.apikeys import ApiKey

bp = Blueprint("drafts", __name__, url_prefix="/api/v1/workflows")


def publishable(key: str, document: Any, api_key: ApiKey) -> Definition:
    """`document` as the next version of `key`, as this key may publish it: the checker's
    rules, its secrets, and every workflow its workflow steps start. A workflow step starts
    its child past the child's webhook signature, with input this publisher chooses: acting
    on that workflow, so the key must be one that may write it (docs/reference/security.md,
    "A scoped key acts only on its workflows")."""
    settings = current_app.extensions["flowforge.settings"]
    definition = catalog.publishable(
        key, document, settings.secret_bindings, may_use_secrets=api_key.publish_secrets
    )
    called = [w for w in definition.child_workflows() if not api_key.allows(w, write=True)]
    if called:
        raise Forbidden(
            f"this API key may not write workflow {called[0]!r}, which a workflow step would start"
        )
    return definition


def check_draft(conn: Any, key: str, document: Any, api_key: Any) -> dict[str, Any]:
    """What publishing `document` as the next version of `key` would do, or the refusal
    it would meet (DefinitionInvalid, Forbidden); nothing is written."""
    definition = publishable(key, document, api_key)
    try:
        newest = catalog.get_workflow(conn, key)["latest_version"]
    except NotFound:
        newest = None
    changes: list[list[str]] = []
    if newest is not None:
        published = catalog.get_version(conn, key, newest)["definition"]
        changes = [list(c) for c in defdiff.diff(published, document).changes]
    return {
        "workflow": key,
        "valid": True,
        "newest_version": newest,
        "changes": changes,
        "steps": graph(definition),
    }


def graph(definition: Definition) -> list[dict[str, Any]]:
    """The draft's steps as a DAG preview: id, type and the steps each depends on."""
    return [
        {"id": step.id, "type": step.type, "depends_on": list(step.depends_on)}
        for step in definition.steps
    ]


@bp.post("/<workflow_key(answer='publish'):key>/check")
@key_required
@requires(Access.ADMINISTER)
def check(key: str) -> Response:
    """Check a draft as publishing would, publishing nothing."""
    api_key = authorize(key, write=True)
    document = json_body()
    with connection() as conn:
        return jsonify(check_draft(conn, key, document, api_key))
