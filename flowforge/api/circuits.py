"""Circuit breakers and Retry-After holds of outbound limits (docs/contract.md#outbound-limits):
which are in force, and ending one by hand. A workflow's limits are its own, so a key scoped to
workflows sees and clears only theirs; the operator's host and shared limits need a key
for every workflow (docs/reference/security.md, "Who owns a limit")."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from flowforge.api.auth import authorize, key_required, requires
from flowforge.api.pool import connection
from flowforge.domain.roles import Access
from flowforge.errors import Forbidden, NotFound
from flowforge.store import outbound

bp = Blueprint("circuits", __name__, url_prefix="/api/v1/circuits")


@bp.get("")
@key_required
@requires(Access.READ)
def list_open() -> Response:
    """Every limit whose circuit is open or half-open or that a Retry-After holds."""
    api_key = authorize(None, write=False)
    with connection() as conn:
        return jsonify({"circuits": outbound.open_or_held(conn, api_key.workflows)})


@bp.post("/<path:key>/close")
@key_required
@requires(Access.ADMINISTER)
def close(key: str) -> Response:
    """Close a limit's circuit and end its hold now: its waiting steps go at once. A
    workflow's own limit is named with ?workflow=NAME; the operator's as host:NAME or
    shared:NAME."""
    workflow = request.args.get("workflow")
    api_key = authorize(workflow, write=True)
    if workflow is None and api_key.workflows is not None:
        raise Forbidden("the operator's limits need a key for every workflow")
    with connection() as conn:
        found = outbound.find_key(conn, key, workflow)
        if found is None or not outbound.clear(conn, found):
            raise NotFound(f"no open circuit or hold has key {key!r}")
    return jsonify({"key": key, "workflow": workflow, "state": "closed", "held_until": None})
