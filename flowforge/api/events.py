"""Events correlated by a business key (docs/contract.md#events): `POST /api/v1/events`
sends one, `GET /api/v1/events` lists those kept.

Who may send what: an API key for every workflow sends events any workflow's wait may
take; a key scoped to workflows sends events only the waits of those workflows may take
(the event's audience is the key's scope), so no key can end another team's waits. Events
a workflow's verified deliveries emit (`emits`) are taken only by waits that name that
workflow in `from`: the API cannot forge them.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from flowforge.api.auth import authorize, key_required, requires
from flowforge.api.bodies import parse_json, read_body
from flowforge.api.pool import connection
from flowforge.domain.definitions.bounds import MAX_EVENT_KEY_CHARS
from flowforge.domain.roles import Access
from flowforge.errors import InvalidParameter
from flowforge.store import events as event_store
from flowforge.usecases import events

bp = Blueprint("events", __name__, url_prefix="/api/v1/events")

MAX_LIST = 500


@bp.post("")
@key_required
@requires(Access.OPERATE)
def send() -> tuple[Response, int, dict[str, str]]:
    """Record an event and offer it to the waits open for its name and key."""
    api_key = authorize(None, write=True)
    if request.query_string:
        raise InvalidParameter("Query string not accepted", "put the event in the JSON body")
    event = events.check_event(parse_json(read_body()))
    audience = None if api_key.workflows is None else sorted(api_key.workflows)
    with connection() as conn:
        answer = events.send_checked(conn, event, audience)
    if answer["replayed"]:
        return jsonify(answer), 200, {"Idempotent-Replayed": "true"}
    return jsonify(answer), 202, {"Location": f"/api/v1/events?name={answer['name']}"}


@bp.get("")
@key_required
@requires(Access.READ)
def list_events() -> Response:
    """The events kept (not expired), newest first, by name and key; a key scoped to
    workflows sees those its workflows may take or emitted."""
    api_key = authorize(None, write=False)
    unknown = set(request.args) - {"name", "key", "limit"}
    if unknown:
        raise InvalidParameter("Unknown parameter", f"unknown parameter {sorted(unknown)[0]!r}")
    raw_limit = request.args.get("limit", "100")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST:
        raise InvalidParameter("Invalid limit", f"limit must be 1 to {MAX_LIST}")
    name, key = request.args.get("name"), request.args.get("key")
    if name is not None and not events.is_name(name):
        raise InvalidParameter("Invalid name", "name must be an event name such as payment.settled")
    if key is not None and not events.is_text(key, MAX_EVENT_KEY_CHARS):
        raise InvalidParameter("Invalid key", "key must be 1 to 200 characters")
    scope = None if api_key.workflows is None else sorted(api_key.workflows)
    with connection() as conn:
        found = event_store.listed(conn, name, key, scope, int(raw_limit))
    return jsonify({"events": found})
