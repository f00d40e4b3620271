"""The OpenAPI paths of api/failures.py (docs/contract.md#failure-groups), written with
api/openapi_parts.py's helpers."""

from __future__ import annotations

from typing import Any

from flowforge.api.openapi_parts import (
    AUTHENTICATED,
    KEY_PATTERN,
    STEP_ID_PATTERN,
    endpoint,
    json_answer,
    listing,
    on_one,
    path_param,
    problem_answers,
)
from flowforge.domain.model import MAX_PAGE, MAX_VERSION
from flowforge.store import failures

TAGS = ["failures"]
UUID = {"type": "string", "format": "uuid"}
INSTANT = {"type": "string", "format": "date-time"}
GROUP: dict[str, Any] = {
    "type": "object",
    "required": ["id", "workflow", "step", "outcome", "kind", "message", "status", "count"],
    "properties": {
        "id": {"type": "integer"},
        "workflow": {"type": "string"},
        "step": {
            "type": "string",
            "description": "the step that failed ('' for none: a deadline); a map item's "
            "row with its index taken out (items[].charge)",
        },
        "outcome": {"type": "string", "enum": ["failed", "unknown"]},
        "status_class": {"type": ["string", "null"], "description": "5xx, 4xx ..."},
        "code": {"type": ["integer", "null"], "description": "the HTTP status"},
        "kind": {"type": "string", "description": "http_status, no_response, not_sent ..."},
        "message": {"type": "string", "description": "the error, normalised"},
        "status": {"type": "string", "enum": list(failures.STATUSES)},
        "count": {"type": "integer", "description": "failures counted into it"},
        "pending": {
            "type": "integer",
            "description": "its executions failed or unknown, not replayed yet (up to 10,000)",
        },
        "first_seen": INSTANT,
        "last_seen": INSTANT,
        "opened_at": INSTANT,
        "status_at": {"type": ["string", "null"], "format": "date-time"},
        "status_by": {"type": ["object", "null"]},
        "last_execution_id": UUID,
        "executions": {
            "type": "array",
            "description": "the newest executions (one group's page only)",
            "items": {"type": "object"},
        },
    },
}
BATCH = {
    "after": {**UUID, "description": "the previous batch's next_after"},
    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100},
}
REPLAY_BODY = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        **BATCH,
        "from_step": {
            "type": "string",
            "pattern": STEP_ID_PATTERN,
            "description": "default: the group's step",
        },
        "version": {
            "oneOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_VERSION},
                {"const": "latest"},
            ],
            "default": "latest",
        },
    },
}
RETRY_BODY = {"type": "object", "additionalProperties": False, "properties": BATCH}
REFUSED = {"type": "array", "items": {"type": "object"}}


def _done(field: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": [field, "refused", "next_after"],
        "properties": {
            field: {"type": "array", "items": UUID},
            "refused": REFUSED,
            "next_after": {"type": ["string", "null"], "format": "uuid"},
        },
    }


def paths() -> dict[str, Any]:
    """The failure groups' paths."""
    group_id = path_param("group_id", {"type": "integer", "minimum": 1}, "The group's id")
    one = json_answer(GROUP, "The group")

    def status(summary: str) -> dict[str, Any]:
        return {"post": on_one(summary, one, tags=TAGS, parameter=group_id)}

    def batch(summary: str, body: dict[str, Any], field: str) -> dict[str, Any]:
        answers = {
            "200": json_answer(_done(field), "One batch done"),
            **problem_answers(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
        }
        return {"post": endpoint(summary, answers, tags=TAGS, parameters=[group_id], body=body)}

    query = [
        {
            "name": "workflow",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "pattern": KEY_PATTERN},
        },
        {
            "name": "status",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "enum": list(failures.STATUSES)},
        },
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100},
        },
    ]
    return {
        "/api/v1/failure-groups": {
            "get": endpoint(
                "Failure groups, the most recently seen first",
                {
                    "200": json_answer(listing("groups", GROUP), "The groups"),
                    **problem_answers(400, 403, *AUTHENTICATED),
                },
                tags=TAGS,
                parameters=query,
            )
        },
        "/api/v1/failure-groups/{group_id}": {
            "get": on_one(
                "One failure group with its newest executions", one, tags=TAGS, parameter=group_id
            )
        },
        "/api/v1/failure-groups/{group_id}/resolve": status(
            "Resolve a group: its next failure reopens it and alerts once"
        ),
        "/api/v1/failure-groups/{group_id}/ignore": status(
            "Ignore a group: it counts on, silently"
        ),
        "/api/v1/failure-groups/{group_id}/reopen": status("Open a group again (no alert)"),
        "/api/v1/failure-groups/{group_id}/replay": batch(
            "Replay one batch of the group's failed executions onto a version",
            REPLAY_BODY,
            "replayed",
        ),
        "/api/v1/failure-groups/{group_id}/retry": batch(
            "Retry one batch of the group's failed executions in place", RETRY_BODY, "retried"
        ),
    }
