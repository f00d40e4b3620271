"""Sources (docs/contract.md#sources): POST /api/v1/sources/<name> defines one /hooks/<name>
endpoint routed to several workflows; its signing secrets are managed beside it."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g, jsonify

from flowforge.api.auth import key_required, requires
from flowforge.api.bodies import json_body, supplied_secret
from flowforge.api.pool import connection
from flowforge.domain.roles import Access
from flowforge.errors import Forbidden
from flowforge.store import sources
from flowforge.store.apikeys import ApiKey
from flowforge.trust import signatures
from flowforge.usecases import routing

bp = Blueprint("sources", __name__, url_prefix="/api/v1/sources")


def _authorize(*, write: bool) -> None:
    """A source may start any workflow it names: only a key scoped to every workflow may
    change one (reading needs no more than reading every workflow)."""
    api_key: ApiKey = g.api_key
    if api_key.workflows is not None or (write and api_key.read_only):
        raise Forbidden("sources need an API key scoped to every workflow")


@bp.post("/<workflow_key(answer='publish'):name>")
@key_required
@requires(Access.ADMINISTER)
def save(name: str) -> tuple[Response, int]:
    """Create or replace a source: its auth preset and its subscriptions."""
    _authorize(write=True)
    auth, subscriptions = sources.parse(json_body())
    with connection() as conn:
        return jsonify(sources.save(conn, name, auth, subscriptions)), 200


@bp.get("/<workflow_key:name>")
@key_required
@requires(Access.READ)
def show(name: str) -> Response:
    _authorize(write=False)
    with connection() as conn:
        return jsonify(sources.show(conn, name))


@bp.post("/<workflow_key:name>/webhook-secrets")
@key_required
@requires(Access.ADMINISTER)
def create_secret(name: str) -> tuple[Response, int]:
    """Add a signing secret: the provider's `{"value": ...}`, or (no body) a Standard
    Webhooks one made here and shown in this answer only."""
    _authorize(write=True)
    supplied = supplied_secret()
    value = supplied if supplied is not None else signatures.new_secret()
    encryption_key = current_app.extensions["flowforge.settings"].encryption_key
    with connection() as conn:
        created = sources.create_secret(conn, name, value, encryption_key)
        routing.SOURCES.forget(conn, name, encryption_key)
    if supplied is None:
        created["secret"] = value
    return jsonify(created), 201


@bp.delete("/<workflow_key:name>/webhook-secrets/<int:secret_id>")
@key_required
@requires(Access.ADMINISTER)
def revoke_secret(name: str, secret_id: int) -> tuple[str, int]:
    _authorize(write=True)
    with connection() as conn:
        sources.revoke_secret(conn, name, secret_id)
        encryption_key = current_app.extensions["flowforge.settings"].encryption_key
        routing.SOURCES.forget(conn, name, encryption_key)
    return "", 204
