"""Reading executions and the operator actions on them."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from flask import Blueprint, Response, g, jsonify, request

from flowforge import actions, catalog, definitions, flowcontrol, timeline
from flowforge.api.auth import authorize, key_required
from flowforge.api.bodies import json_body
from flowforge.api.pool import connection
from flowforge.api.problems import Problem
from flowforge.apikeys import ApiKey
from flowforge.model import MAX_PAGE, RESOLUTIONS, ExecutionStatus

bp = Blueprint("executions", __name__, url_prefix="/api/v1/executions")

STATUSES = tuple(status.value for status in ExecutionStatus)


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
def show(execution_id: str) -> Response:
    """The execution with its steps, attempts and event history."""
    _authorize_execution(execution_id, write=False)
    with connection() as conn:
        detail = timeline.execution_detail(conn, execution_id)
        detail["flow_control"] = flowcontrol.flow_state(conn, execution_id)
        return jsonify(detail)


@bp.get("")
@key_required
def list_page() -> Response:
    """A keyset-paginated list, newest first."""
    key: ApiKey = g.api_key
    args = request.args
    status = args.get("status")
    if status is not None and status not in STATUSES:
        raise Problem(400, "Invalid status", f"status must be one of {', '.join(STATUSES)}")
    try:
        limit = int(args.get("limit", "50"))
    except ValueError:
        raise Problem(400, "Invalid limit", "limit must be an integer") from None
    if not 1 <= limit <= MAX_PAGE:
        raise Problem(400, "Invalid limit", f"limit must be between 1 and {MAX_PAGE}")
    workflow = args.get("workflow")
    if workflow is not None and not catalog.is_key(workflow):
        # Also keeps NUL bytes, which PostgreSQL text cannot hold, away from the query.
        raise Problem(400, "Invalid workflow", "workflow must be a workflow key")
    if workflow is not None and not key.allows(workflow, write=False):
        raise Problem(403, "Forbidden", "this API key may not read this workflow")
    since, until = _instant(args, "since"), _instant(args, "until")
    with connection() as conn:
        page = timeline.list_executions(
            conn,
            workflow=workflow,
            workflows=key.workflows,
            status=status,
            limit=limit,
            cursor=args.get("cursor"),
            since=since,
            until=until,
        )
    return jsonify(page)


def _instant(args: Mapping[str, str], name: str) -> datetime | None:
    """An ISO 8601 instant from the query (UTC when it names no offset), else None."""
    text = args.get(name)
    if text is None:
        return None
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise Problem(
            400,
            f"Invalid {name}",
            f"{name} must be an ISO 8601 instant, such as 2026-12-01T09:00:00Z",
        ) from None
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


@bp.post("/<execution_id:execution_id>/cancel")
@key_required
def cancel(execution_id: str) -> tuple[Response, int]:
    """Cancel: 202 while work is stopping, 200 once the execution is terminal."""
    _authorize_execution(execution_id, write=True)
    with connection() as conn:
        status, was_terminal = actions.cancel(conn, execution_id, actor=_request_key().actor())
    code = 200 if was_terminal else 202
    return jsonify({"execution_id": execution_id, "status": status}), code


@bp.post("/<execution_id:execution_id>/retry")
@key_required
def retry(execution_id: str) -> tuple[Response, int]:
    """Re-run failed and cancelled steps, reusing every checkpoint; unknown ones stay unknown."""
    _authorize_execution(execution_id, write=True)
    with connection() as conn:
        status = actions.retry(conn, execution_id, actor=_request_key().actor())
    return jsonify({"execution_id": execution_id, "status": status}), 202


@bp.post("/<execution_id:execution_id>/steps/<step_id>/resolve")
@key_required
def resolve(execution_id: str, step_id: str) -> tuple[Response, int]:
    """Settle a step in `unknown`: {"outcome": "succeeded", "output": ...} or "failed"."""
    _authorize_execution(execution_id, write=True)
    if not definitions.is_step_id(step_id):
        raise Problem(404, "Not found", "no such step")
    body = json_body()
    # A tuple, not a set: a JSON object as outcome is unhashable and must be a 422, not a 500.
    if not isinstance(body, dict) or body.get("outcome") not in RESOLUTIONS:
        raise Problem(
            422,
            "Invalid resolution",
            "outcome must be 'succeeded' or 'failed'",
            errors=[{"path": "$.outcome", "message": "must be succeeded or failed"}],
        )
    unknown_keys = set(body) - {"outcome", "output"}
    if unknown_keys:
        raise Problem(
            422,
            "Invalid resolution",
            "unexpected fields",
            errors=[
                {"path": f"$.{k}", "message": "unexpected field"} for k in sorted(unknown_keys)
            ],
        )
    with connection() as conn:
        status = actions.resolve(
            conn,
            execution_id,
            step_id,
            body["outcome"],
            body.get("output"),
            actor=_request_key().actor(),
        )
    return jsonify({"execution_id": execution_id, "status": status}), 200


@bp.post("/<execution_id:execution_id>/steps/<step_id>/complete")
@key_required
def complete(execution_id: str, step_id: str) -> tuple[Response, int]:
    """End a waiting wait step as a resume would: {"output": ...} becomes its output."""
    _authorize_execution(execution_id, write=True)
    if not definitions.is_step_id(step_id):
        raise Problem(404, "Not found", "no such step")
    body = json_body()
    if not isinstance(body, dict) or set(body) - {"output"}:
        raise Problem(
            422,
            "Invalid completion",
            'send {"output": <any JSON>} (output may be left out: null)',
            errors=[{"path": "$", "message": "an object with only output"}],
        )
    with connection() as conn:
        status = actions.complete_wait(
            conn, execution_id, step_id, body.get("output"), actor=_request_key().actor()
        )
    return jsonify({"execution_id": execution_id, "status": status}), 200


@bp.post("/<execution_id:execution_id>/steps/<step_id>/fail")
@key_required
def fail(execution_id: str, step_id: str) -> tuple[Response, int]:
    """Fail a waiting wait step: the answer is no, and the execution fails."""
    _authorize_execution(execution_id, write=True)
    if not definitions.is_step_id(step_id):
        raise Problem(404, "Not found", "no such step")
    with connection() as conn:
        status = actions.fail_wait(conn, execution_id, step_id, actor=_request_key().actor())
    return jsonify({"execution_id": execution_id, "status": status}), 200


def _request_key() -> ApiKey:
    """The API key that authenticated this request (api/auth.key_required put it in g)."""
    key: ApiKey = g.api_key
    return key
