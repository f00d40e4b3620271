"""The OpenAPI paths of api/approvals.py (docs/contract.md#approvals), built with
api/openapi.py's own helpers, which it passes in: this module imports none of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowforge.api.openapi_parts import EXECUTION_ID, STEP_PARAM, ref
from flowforge.usecases.approvals import DECISIONS

APPROVAL = {
    "type": "object",
    "required": ["execution_id", "step", "workflow", "version", "title", "form", "assignees"],
    "properties": {
        "execution_id": {"type": "string", "format": "uuid"},
        "step": {"type": "string"},
        "workflow": {"type": "string"},
        "version": {"type": "integer"},
        "title": {"type": "string"},
        "form": ref("ApprovalForm"),
        "assignees": {"type": "array", "items": {"type": "string"}},
        "waiting_since": {"type": ["string", "null"], "format": "date-time"},
        "expires_at": {"type": "string", "format": "date-time"},
    },
}
DECISION = {
    "type": "object",
    "required": ["decision"],
    "additionalProperties": False,
    "properties": {
        "decision": {"type": "string", "enum": list(DECISIONS)},
        "values": {
            "type": "object",
            "description": "the form's values (approve): checked against the form, 422 with "
            "a path per bad field; ignored on reject",
        },
    },
}
DECIDED = {
    "type": "object",
    "required": ["execution_id", "step", "decision", "decided_by", "decided_at", "status"],
    "properties": {
        "execution_id": {"type": "string", "format": "uuid"},
        "step": {"type": "string"},
        "decision": {"type": "string", "enum": list(DECISIONS)},
        "decided_by": {"type": "string"},
        "decided_at": {"type": "string", "format": "date-time"},
        "status": {"type": "string", "description": "the execution's status after"},
        "output": {"description": "the step's output (approve): values, decided_by, decided_at"},
    },
}


def paths(
    operation: Callable[..., dict[str, Any]],
    json: Callable[[dict[str, Any], str], dict[str, Any]],
    problems: Callable[..., dict[str, Any]],
    authenticated: tuple[int, ...],
) -> dict[str, Any]:
    """The paths, from openapi.py's `endpoint`, `json_answer` and `problem_answers`."""
    tags = ["approvals"]
    assignee = {
        "name": "assignee",
        "in": "query",
        "required": False,
        "description": "only approvals that name this user (an API key's name) or nobody",
        "schema": {"type": "string"},
    }
    listed = {"type": "object", "required": ["approvals"], "properties": {
        "approvals": {"type": "array", "items": APPROVAL}}}  # fmt: skip
    return {
        "/api/v1/approvals": {
            "get": operation(
                "Open approvals (wait steps with a form), soonest to expire first",
                {"200": json(listed, "Open approvals"), **problems(400, 403, *authenticated)},
                tags=tags,
                parameters=[assignee],
            ),
        },
        "/api/v1/approvals/{id}/{step}": {
            "post": operation(
                "Approve (the form's values) or reject an open approval; an operator action",
                {
                    "200": json(DECIDED, "Decided"),
                    **problems(400, 403, 404, 409, 413, 415, 422, *authenticated),
                },
                tags=tags,
                parameters=[EXECUTION_ID, STEP_PARAM],
                body=DECISION,
            ),
        },
    }
