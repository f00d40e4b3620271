"""The OpenAPI paths of api/approvals.py (docs/contract.md#approvals), written with
api/openapi_parts.py's helpers."""

from __future__ import annotations

from typing import Any

from flowforge.api.openapi_parts import (
    AUTHENTICATED,
    EXECUTION_ID,
    STEP_PARAM,
    endpoint,
    json_answer,
    listing,
    problem_answers,
    ref,
)
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


def paths() -> dict[str, Any]:
    """The approvals' paths."""
    tags = ["approvals"]
    assignee = {
        "name": "assignee",
        "in": "query",
        "required": False,
        "description": "only approvals that name this user (an API key's name) or nobody",
        "schema": {"type": "string"},
    }
    return {
        "/api/v1/approvals": {
            "get": endpoint(
                "Open approvals (wait steps with a form), soonest to expire first",
                {
                    "200": json_answer(listing("approvals", APPROVAL), "Open approvals"),
                    **problem_answers(400, 403, *AUTHENTICATED),
                },
                tags=tags,
                parameters=[assignee],
            ),
        },
        "/api/v1/approvals/{id}/{step}": {
            "post": endpoint(
                "Approve (the form's values) or reject an open approval; an operator action",
                {
                    "200": json_answer(DECIDED, "Decided"),
                    **problem_answers(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
                },
                tags=tags,
                parameters=[EXECUTION_ID, STEP_PARAM],
                body=DECISION,
            ),
        },
    }
