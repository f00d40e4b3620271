"""A workflow's schedule (docs/contract.md#schedules): what it will do, what it did, and the
operator's pause, resume, trigger and backfill. Reads and writes are in
flowforge/store/schedules.py."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import Blueprint, Response, g, jsonify

from flowforge.api.auth import authorize, key_required, requires
from flowforge.api.bodies import json_body
from flowforge.api.pool import connection
from flowforge.domain.definitions import parse_until
from flowforge.domain.roles import Access
from flowforge.errors import InvalidBody
from flowforge.store import schedules
from flowforge.store.apikeys import ApiKey
from flowforge.usecases import ticks

bp = Blueprint("schedules", __name__, url_prefix="/api/v1/workflows")

# One Ticker per process: it caches intake targets, re-checked by the intake statement.
_TICKER = ticks.Ticker()


@bp.get("/<workflow_key:key>/schedule")
@key_required
@requires(Access.READ)
def show(key: str) -> Response:
    """The schedule, its next fire times (its zone and UTC) and its recent ledger."""
    authorize(key, write=False)
    with connection() as conn:
        return jsonify(schedules.show(conn, key))


def _set_paused(key: str, paused: bool) -> Response:
    authorize(key, write=True)
    with connection() as conn:
        return jsonify(schedules.set_paused(conn, key, paused, _request_key().actor()))


@bp.post("/<workflow_key:key>/schedule/pause")
@key_required
@requires(Access.OPERATE)
def pause(key: str) -> Response:
    """Pause: due ticks are ledgered `paused` and do not fire (idempotent)."""
    return _set_paused(key, True)


@bp.post("/<workflow_key:key>/schedule/resume")
@key_required
@requires(Access.OPERATE)
def resume(key: str) -> Response:
    """Resume: ticks fire again from now on (idempotent)."""
    return _set_paused(key, False)


@bp.post("/<workflow_key:key>/schedule/trigger")
@key_required
@requires(Access.OPERATE)
def trigger(key: str) -> tuple[Response, int]:
    """Fire a tick now, under the overlap policy; the answer says what became of it."""
    authorize(key, write=True)
    with connection() as conn:
        outcome = _TICKER.trigger(conn, key, _request_key().actor())
    return jsonify(outcome.view()), 201 if outcome.execution_id else 200


@bp.post("/<workflow_key:key>/schedule/backfill")
@key_required
@requires(Access.OPERATE)
def backfill(key: str) -> Response:
    """Fire the ticks of a past range that have not fired ({from, to, dry_run})."""
    authorize(key, write=True)
    body = json_body()
    if (
        not isinstance(body, dict)
        or not {"from", "to"} <= set(body)
        or set(body)
        - {
            "from",
            "to",
            "dry_run",
        }
    ):
        raise InvalidBody("Invalid backfill", 'send {"from": ..., "to": ..., "dry_run": bool}')
    start, end = _instant(body["from"], "from"), _instant(body["to"], "to")
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise InvalidBody("Invalid backfill", "dry_run must be true or false")
    if end < start:
        raise InvalidBody("Invalid backfill", "to must not be before from")
    with connection() as conn:
        items = _TICKER.backfill(
            conn, key, start, end, dry_run=dry_run, actor=_request_key().actor()
        )
    return jsonify({"dry_run": dry_run, "items": items})


def _instant(value: Any, name: str) -> datetime:
    """An ISO-8601 instant with a timezone FlowForge can store, or a 422 naming the field."""
    try:
        if not isinstance(value, str):
            raise ValueError("not a string")
        return parse_until(value)
    except ValueError:
        raise InvalidBody(
            "Invalid backfill", f"{name} must be an ISO-8601 instant with a timezone"
        ) from None


def _request_key() -> ApiKey:
    """The API key that authenticated this request (api/auth.key_required put it in g)."""
    key: ApiKey = g.api_key
    return key
