"""GET /api/v1/me: the calling key as the server sees it, its role above all, so a script
or the remote CLI can tell what it may do before it tries (docs/contract.md#roles)."""

from __future__ import annotations

from flask import Blueprint, Response, g, jsonify

from flowforge.api.auth import key_required, requires
from flowforge.domain.roles import Access
from flowforge.store.apikeys import ApiKey

bp = Blueprint("me", __name__, url_prefix="/api/v1/me")


@bp.get("")
@key_required
@requires(Access.READ)
def show() -> Response:
    """The key's id, name, role, workflow scope (null: every workflow) and secrets grant;
    answered from the key already authenticated, so it costs no further query."""
    key: ApiKey = g.api_key
    return jsonify(
        {
            "id": key.id,
            "name": key.name,
            "role": key.role.value,
            "workflows": None if key.workflows is None else list(key.workflows),
            "publish_secrets": key.publish_secrets,
        }
    )
