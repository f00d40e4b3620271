"""Reading executions and the operator actions on them."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Response, g, jsonify, request

from flowforge.api.auth import authorize, key_required, requires
from flowforge.api.bodies import json_body
from flowforge.api.paths import action_step
from flowforge.api.pool import connection
from flowforge.api.queryargs import page_limit, readable_workflow, status_filter
from flowforge.domain import definitions
from flowforge.domain.model import (
    DEFAULT_PAGE,
    MAX_ERROR_FILTER_CHARS,
    MAX_PAGE,
    MAX_VERSION,
    RESOLUTIONS,
    ExecutionQuery,
    ExecutionStatus,
    ItemStatus,
    is_key,
)
from flowforge.domain.operations import ACTIONS, Action, Kind
from flowforge.domain.roles import Access
from flowforge.errors import InvalidBody, InvalidParameter, NotFound
from flowforge.store import outbound, timeline
from flowforge.store.apikeys import ApiKey
from flowforge.usecases import actions, grouping, replay

bp = Blueprint("executions", __name__, url_prefix="/api/v1/executions")

STATUSES = tuple(status.value for status in ExecutionStatus)
# A list's filter by a search attribute: `attr.order_id=4711`.
ATTR_PREFIX = "attr."


def _authorize_execution(execution_id: str, *, write: bool) -> None:
    """Scope check by the execution's workflow; unknown ids are 404 after authentication."""
    key: ApiKey = g.api_key
    if key.workflows is None and not (write and key.read_only):
        return
    with connection() as conn:
        workflow = timeline.workflow_of(conn, execution_id)
    authorize(workflow, write=write)


@bp.get("/<execution_id:execution_id>")
@key_required
@requires(Access.READ)
def show(execution_id: str) -> Response:
    """The execution with its steps, attempts and event history."""
    _authorize_execution(execution_id, write=False)
    with connection() as conn:
        detail = timeline.execution_detail(conn, execution_id)
        detail.update(replay.links(conn, execution_id))
        # docs/contract.md#outbound-limits: ready steps that wait for an outbound limit, and why.
        detail["waiting_on_limits"] = outbound.waiting_on_limits(conn, execution_id)
        # docs/contract.md#debounce-batch: the debounce or batch group (and its events) it was
        # started from.
        detail["built_from"] = grouping.built_from(conn, execution_id)
        return jsonify(detail)


@bp.get("/<execution_id:execution_id>/steps/<step_id>/items")
@key_required
@requires(Access.READ)
def map_items(execution_id: str, step_id: str) -> Response:
    """A page of a map step's items (docs/contract.md#map): counts by status, then items in index
    order, each with its steps; `status` keeps one status, `after` an index continues."""
    _authorize_execution(execution_id, write=False)
    if not definitions.is_step_id(step_id):
        raise NotFound("no such step")
    args = request.args
    status = args.get("status")
    if status is not None and status not in set(ItemStatus):
        choices = ", ".join(ItemStatus)
        raise InvalidParameter("Invalid status", f"status must be one of {choices}")
    try:
        limit = int(args.get("limit", DEFAULT_PAGE))
        after = int(args.get("after", "-1"))
    except ValueError:
        raise InvalidParameter("Invalid page", "limit and after must be integers") from None
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidParameter("Invalid limit", f"limit must be between 1 and {MAX_PAGE}")
    if not -1 <= after <= definitions.MAX_MAP_ITEMS:
        raise InvalidParameter(
            "Invalid page", f"after must be an index from -1 to {definitions.MAX_MAP_ITEMS}"
        )
    with connection() as conn:
        page = timeline.map_page(
            conn, execution_id, step_id, status=status, after=after, limit=limit
        )
    return jsonify(page)


@bp.get("")
@key_required
@requires(Access.READ)
def list_page() -> Response:
    """A keyset-paginated list, newest first."""
    key: ApiKey = g.api_key
    args = request.args
    status = status_filter(args, STATUSES)
    limit = page_limit(args, DEFAULT_PAGE)
    workflow = readable_workflow(args, key)
    since, until = _instant(args, "since"), _instant(args, "until")
    attributes = attribute_args(args)
    with connection() as conn:
        query = ExecutionQuery(
            workflow=workflow,
            status=status,
            limit=limit,
            cursor=args.get("cursor"),
            since=since,
            until=until,
            workflows=key.workflows,
            attributes=attributes,
        )
        page = timeline.list_executions(conn, query)
    return jsonify(page)


def attribute_args(args: Any) -> tuple[tuple[str, str], ...]:
    """The `attr.NAME=value` parameters of a list (docs/contract.md#search-attributes), all
    of which an execution must have; 422 naming each parameter that is no such filter."""
    pairs = [
        (name, name.removeprefix(ATTR_PREFIX), value)
        for name, value in args.items(multi=True)
        if name.startswith(ATTR_PREFIX)
    ]
    return definitions.attribute_filter(pairs) if pairs else ()


def _instant(args: Mapping[str, str], name: str) -> datetime | None:
    """An ISO 8601 instant from the query (UTC when it names no offset), else None."""
    text = args.get(name)
    if text is None:
        return None
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidParameter(
            f"Invalid {name}",
            f"{name} must be an ISO 8601 instant, such as 2026-12-01T09:00:00Z",
        ) from None
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


def _values(action: Action, step_id: str | None) -> list[Any]:
    """The values of an action's params, in their order: the path's step, then the body's
    fields (only those, an object; a 422 names each field that is wrong)."""
    values: list[Any] = action_step(action, step_id)
    if not action.fields:
        return values
    body = json_body()
    fields = {p.field for p in action.fields}
    title = f"Invalid {str(action.body).lower()}"
    if not isinstance(body, dict):
        raise InvalidBody(
            title,
            f"send an object with {', '.join(sorted(fields))}",
            errors=[{"path": "$", "message": "an object"}],
        )
    errors = [{"path": f"$.{k}", "message": "unexpected field"} for k in sorted(set(body) - fields)]
    for param in action.fields:
        value = body.get(param.field)
        # A tuple, not a set: a JSON object as outcome is unhashable and must be a 422.
        if param.kind is Kind.OUTCOME and value not in RESOLUTIONS:
            errors.append({"path": "$.outcome", "message": "must be succeeded or failed"})
        values.append(value)
    if errors:
        raise InvalidBody(title, "the body's fields", errors=errors)
    return values


def _route(action: Action) -> Callable[..., tuple[Response, int]]:
    """The API's route of a declared action (flowforge/domain/operations.py): the key may
    write the execution's workflow, the unit of work runs with it as the actor."""

    def act(execution_id: str, step_id: str | None = None) -> tuple[Response, int]:
        _authorize_execution(execution_id, write=True)
        values = _values(action, step_id)
        with connection() as conn:
            done = actions.perform(conn, action, execution_id, values, actor=_request_key().actor())
        return jsonify(done.body()), action.code(done)

    act.__doc__ = action.summary
    return key_required(requires(Access.OPERATE)(act))


for _action in ACTIONS:
    bp.add_url_rule(
        "/" + _action.path("<execution_id:execution_id>", "<step_id>"),
        endpoint=_action.name,
        view_func=_route(_action),
        methods=["POST"],
    )


def _replay_target(body: Any) -> tuple[str, int | None]:
    """`from_step` and `version` (a number, or "latest": None) of a replay request."""
    errors = []
    from_step = body.get("from_step")
    if not isinstance(from_step, str) or not definitions.is_step_id(from_step):
        errors.append({"path": "$.from_step", "message": "a step id is required"})
    version = body.get("version", "latest")
    if version != "latest" and (
        not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= MAX_VERSION
    ):
        errors.append({"path": "$.version", "message": 'a version number or "latest"'})
    if errors:
        raise InvalidBody("Invalid replay", "from_step and version", errors=errors)
    return str(from_step), None if version == "latest" else int(version)


def _unexpected(body: dict[str, Any], allowed: set[str], prefix: str = "$") -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise InvalidBody(
            "Invalid replay",
            "unexpected fields",
            errors=[{"path": f"{prefix}.{k}", "message": "unexpected field"} for k in extra],
        )


@bp.post("/<execution_id:execution_id>/replay")
@key_required
@requires(Access.OPERATE)
def replay_one(execution_id: str) -> tuple[Response, int]:
    """Replay / fork from a step onto a version (docs/contract.md#replay): 201 with the new
    execution."""
    _authorize_execution(execution_id, write=True)
    body = json_body()
    if not isinstance(body, dict):
        raise InvalidBody("Invalid replay", 'send {"from_step": ..., "version": ...}')
    _unexpected(body, {"from_step", "version"})
    from_step, version = _replay_target(body)
    with connection() as conn:
        made = replay.replay(conn, execution_id, from_step, version, actor=_request_key().actor())
    response = jsonify(made.view())
    response.headers["Location"] = f"/api/v1/executions/{made.execution_id}"
    return response, 201


BULK_FIELDS = {"filter", "from_step", "version", "dry_run", "upto", "after", "limit"}
FILTER_FIELDS = {"workflow", "version", "status", "from", "to", "error", "attributes"}


@bp.post("/replay")
@key_required
@requires(Access.OPERATE)
def replay_bulk() -> tuple[Response, int]:
    """Bulk replay by filter: `dry_run` previews the count and the `upto` to confirm with;
    a confirmed call (with that `upto`) replays one batch, oldest first."""
    body = json_body()
    if not isinstance(body, dict):
        raise InvalidBody("Invalid replay", "send an object with filter and from_step")
    _unexpected(body, BULK_FIELDS)
    flt = _bulk_filter(body.get("filter"))
    authorize(flt.workflow, write=True)
    from_step, version = _replay_target(body)
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise InvalidBody("Invalid replay", "dry_run must be a boolean")
    with connection() as conn:
        if dry_run:
            return jsonify({"dry_run": True, **replay.preview(conn, flt)}), 200
        upto, after = body.get("upto"), body.get("after")
        if not isinstance(upto, str) or not _is_uuid(upto):
            raise InvalidBody(
                "Confirmation needed",
                "preview with dry_run first, then pass back its upto",
                errors=[{"path": "$.upto", "message": "the upto of a dry run"}],
            )
        if after is not None and (not isinstance(after, str) or not _is_uuid(after)):
            raise InvalidBody("Invalid replay", "after must be the previous next_after")
        limit = body.get("limit", 100)
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise InvalidBody("Invalid replay", "limit must be an integer")
        done = replay.replay_batch(
            conn,
            flt,
            from_step,
            version,
            upto=upto,
            after=after,
            limit=limit,
            actor=_request_key().actor(),
        )
    return jsonify({"dry_run": False, **done}), 200


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _bulk_filter(raw: Any) -> replay.Filter:
    """A bulk replay's filter; 422 naming each bad field."""
    if not isinstance(raw, dict) or not isinstance(raw.get("workflow"), str):
        raise InvalidBody(
            "Invalid replay",
            "filter.workflow is required",
            errors=[{"path": "$.filter.workflow", "message": "a workflow key"}],
        )
    _unexpected(raw, FILTER_FIELDS, "$.filter")
    # An optional field is left out, never null: /openapi.json types each one.
    errors = [
        {"path": f"$.filter.{name}", "message": "leave it out rather than null"}
        for name, value in raw.items()
        if value is None
    ]
    if not is_key(raw["workflow"]):
        errors.append({"path": "$.filter.workflow", "message": "a workflow key"})
    version = raw.get("version")
    if version is not None and (
        not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= MAX_VERSION
    ):
        errors.append({"path": "$.filter.version", "message": "a version number"})
    status = raw.get("status")
    if status is not None and status not in STATUSES:
        errors.append({"path": "$.filter.status", "message": f"one of {', '.join(STATUSES)}"})
    instants: dict[str, datetime | None] = {}
    for name in ("from", "to"):
        value = raw.get(name)
        instants[name] = None
        if value is None:
            continue
        with contextlib.suppress(ValueError):
            instants[name] = definitions.parse_until(value) if isinstance(value, str) else None
        if instants[name] is None:
            errors.append({"path": f"$.filter.{name}", "message": "an ISO-8601 instant"})
    error = raw.get("error")
    if error is not None and (
        not isinstance(error, str) or not 1 <= len(error) <= MAX_ERROR_FILTER_CHARS
    ):
        errors.append(
            {"path": "$.filter.error", "message": f"text of 1-{MAX_ERROR_FILTER_CHARS} characters"}
        )
    elif isinstance(error, str) and "\x00" in error:
        errors.append({"path": "$.filter.error", "message": "no NUL characters"})
    attributes = _bulk_attributes(raw.get("attributes"), errors)
    if errors:
        raise InvalidBody("Invalid replay", "the filter", errors=errors)
    return replay.Filter(
        workflow=raw["workflow"],
        version=version,
        status=status,
        since=instants["from"],
        until=instants["to"],
        error=error,
        attributes=attributes,
    )


def _bulk_attributes(raw: Any, errors: list[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    """A bulk filter's `attributes` object (docs/contract.md#search-attributes); each
    problem is added to `errors` with its path."""
    if raw is None:
        return ()
    path = "$.filter.attributes"
    if not isinstance(raw, dict) or not raw:
        errors.append({"path": path, "message": "an object of attribute names and values"})
        return ()
    try:
        return definitions.attribute_filter(
            (f"{path}.{name}", name, value) for name, value in raw.items()
        )
    except definitions.AttributeFilterInvalid as exc:
        errors.extend(exc.errors or [])
        return ()


def _request_key() -> ApiKey:
    """The API key that authenticated this request (api/auth.key_required put it in g)."""
    key: ApiKey = g.api_key
    return key
