"""Approvals for tools (docs/contract.md#approvals): the open approvals a key may see, and a
decision on one. The user is the API key's name, as in the console.

Listing is a viewer's read; a decision is an operator's action (docs/contract.md#roles).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, g, jsonify, request

from flowforge.api.auth import authorize, key_required, requires
from flowforge.api.bodies import json_body
from flowforge.api.pool import connection
from flowforge.domain.definitions import form_schema, is_step_id
from flowforge.domain.roles import Access
from flowforge.errors import InvalidBody, InvalidParameter, NotFound
from flowforge.store import approvals, timeline
from flowforge.store.apikeys import ApiKey
from flowforge.usecases import approvals as deciding

bp = Blueprint("approvals", __name__, url_prefix="/api/v1/approvals")


def view(row: dict[str, Any]) -> dict[str, Any]:
    """One open approval as the API shows it."""
    form = row["form"]
    return {
        "execution_id": row["execution_id"],
        "step": row["step"],
        "workflow": row["workflow"],
        "version": row["version"],
        "title": form.title,
        "form": form_schema(form),
        "assignees": list(form.assignees),
        "waiting_since": row["waiting_since"].isoformat() if row["waiting_since"] else None,
        "expires_at": row["expires_at"].isoformat(),
    }


@bp.get("")
@key_required
@requires(Access.READ)
def list_open() -> Response:
    """Open approvals, soonest to expire first; `assignee` keeps those that name it or
    name nobody."""
    unknown = set(request.args) - {"assignee"}
    if unknown:
        raise InvalidParameter(
            "Unknown query parameter", f"unknown parameters: {', '.join(sorted(unknown))}"
        )
    assignee = request.args.get("assignee") or None
    key: ApiKey = authorize(None, write=False)
    with connection() as conn:
        rows = approvals.list_open(conn, assignee=assignee, workflows=key.workflows)
    return jsonify({"approvals": [view(row) for row in rows]})


@bp.post("/<execution_id:execution_id>/<step_id>")
@key_required
@requires(Access.OPERATE)
def decide(execution_id: str, step_id: str) -> Response:
    """Approve with the form's values, or reject: `{"decision": "approve"|"reject",
    "values": {...}}` (an operator action)."""
    if not is_step_id(step_id):
        raise NotFound("no such step")
    body: Any = json_body()
    if not isinstance(body, dict) or set(body) - {"decision", "values"}:
        raise InvalidBody(
            "Decision invalid",
            'the body is {"decision": "approve" or "reject", "values": {...}}',
            errors=[{"path": "$", "message": "an object of decision and values"}],
        )
    decision = body.get("decision")
    if decision not in deciding.DECISIONS:
        raise InvalidBody(
            "Decision invalid",
            'decision is "approve" or "reject"',
            errors=[{"path": "$.decision", "message": 'must be "approve" or "reject"'}],
        )
    with connection() as conn:
        authorize(timeline.workflow_of(conn, execution_id), write=True)
        done = deciding.decide(
            conn, execution_id, step_id, g.api_key, decision, body.get("values", {})
        )
    return jsonify(
        {
            "execution_id": done.execution_id,
            "step": done.step_id,
            "decision": done.decision,
            "decided_by": done.decided_by,
            "decided_at": done.decided_at,
            "status": done.status,
            "output": done.output,
        }
    )
