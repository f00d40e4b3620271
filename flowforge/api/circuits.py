"""Circuit breakers of outbound limits (docs/contract.md#outbound-limits): which are open, and
closing one by hand. A circuit is shared by every workflow whose requests go through its key, so
closing one takes a key that may write every workflow."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from flowforge.api.auth import authorize, key_required
from flowforge.api.pool import connection
from flowforge.errors import Forbidden, NotFound
from flowforge.store import outbound

bp = Blueprint("circuits", __name__, url_prefix="/api/v1/circuits")


@bp.get("")
@key_required
def list_open() -> Response:
    """Every circuit that is open or half-open: key, state, failures, until when."""
    authorize(None, write=False)
    with connection() as conn:
        return jsonify({"circuits": outbound.circuits(conn)})


@bp.post("/<path:key>/close")
@key_required
def close(key: str) -> Response:
    """Close a circuit now: its waiting steps go at their next wake-up."""
    api_key = authorize(None, write=True)
    if api_key.workflows is not None:
        raise Forbidden("closing a circuit needs a key for every workflow")
    with connection() as conn:
        if not outbound.close_circuit(conn, key):
            raise NotFound(f"no open circuit has key {key!r}")
    return jsonify({"key": key, "state": "closed"})
