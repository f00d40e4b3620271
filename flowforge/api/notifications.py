"""Notification endpoints (docs/contract.md#notifications): subscribe a receiver to event
kinds, list and read them with their delivery history, disable, re-enable, delete.
Notifications speak of every workflow, so only a key for every workflow manages them."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify

from flowforge.api.auth import authorize, key_required, requires
from flowforge.api.bodies import json_body
from flowforge.api.pool import connection
from flowforge.domain.roles import Access
from flowforge.errors import Forbidden
from flowforge.store import notifications

bp = Blueprint("notifications", __name__, url_prefix="/api/v1/notifications")


def _admin(write: bool) -> None:
    """A key for every workflow: what a notification reports crosses workflows."""
    if authorize(None, write=write).workflows is not None:
        raise Forbidden("notification endpoints need a key for every workflow")


@bp.post("")
@key_required
@requires(Access.ADMINISTER)
def create() -> tuple[Response, int]:
    """Subscribe an endpoint; the answer shows its signing secret this once."""
    _admin(write=True)
    body: Any = json_body()
    if not isinstance(body, dict):
        raise notifications.EndpointInvalid("the body is a JSON object")
    unknown = set(body) - {"name", "url", "shape", "kinds", "workflow"}
    if unknown:
        raise notifications.EndpointInvalid(f"unknown fields: {', '.join(sorted(unknown))}")
    workflow = body.get("workflow")
    if "workflow" in body and not isinstance(workflow, str):
        raise notifications.EndpointInvalid("workflow: a workflow's name")
    with connection() as conn:
        endpoint = notifications.create(
            conn,
            name=body.get("name", ""),
            url=body.get("url", ""),
            shape=body.get("shape", "standard"),
            kinds=body.get("kinds", []),
            workflow=workflow,
            key=_key(),
        )
    return jsonify(endpoint), 201


def _key() -> bytes | None:
    """FLOWFORGE_NOTIFY_KEY, which seals endpoints' secrets (None: this server has none)."""
    key: bytes | None = current_app.extensions["flowforge.settings"].notify_key
    return key


@bp.get("")
@key_required
@requires(Access.READ)
def list_endpoints() -> Response:
    _admin(write=False)
    with connection() as conn:
        return jsonify({"endpoints": notifications.list_endpoints(conn)})


@bp.get("/<name>")
@key_required
@requires(Access.READ)
def show(name: str) -> Response:
    """One endpoint and its newest deliveries."""
    _admin(write=False)
    with connection() as conn:
        return jsonify(notifications.get(conn, name, deliveries=notifications.HISTORY))


@bp.post("/<name>/rotate")
@key_required
@requires(Access.ADMINISTER)
def rotate(name: str) -> Response:
    """A new signing secret (shown once; body {}), or a Slack endpoint's new URL
    ({"url": ...})."""
    _admin(write=True)
    body: Any = json_body()
    if not isinstance(body, dict) or set(body) - {"url"}:
        raise notifications.EndpointInvalid('the body is {} or {"url": ...} (Slack)')
    if "url" in body and not isinstance(body["url"], str):
        raise notifications.EndpointInvalid("url: a Slack endpoint's new URL, a string")
    with connection() as conn:
        return jsonify(notifications.rotate(conn, name, _key(), body.get("url")))


@bp.post("/<name>/enable")
@key_required
@requires(Access.ADMINISTER)
def enable(name: str) -> Response:
    _admin(write=True)
    with connection() as conn:
        return jsonify(notifications.enable(conn, name))


@bp.post("/<name>/disable")
@key_required
@requires(Access.ADMINISTER)
def disable(name: str) -> Response:
    _admin(write=True)
    with connection() as conn:
        return jsonify(notifications.disable(conn, name))


@bp.delete("/<name>")
@key_required
@requires(Access.ADMINISTER)
def delete(name: str) -> tuple[str, int]:
    _admin(write=True)
    with connection() as conn:
        notifications.delete(conn, name)
    return "", 204
