"""The OpenAPI paths of api/notifications.py (docs/contract.md#notifications), written with
api/openapi_parts.py's helpers."""

from __future__ import annotations

from typing import Any

from flowforge.api.openapi_parts import (
    AUTHENTICATED,
    endpoint,
    json_answer,
    on_one,
    path_param,
    problem_answers,
)
from flowforge.store import notifications

NAME_PATTERN = f"^{notifications.NAME.pattern}$"
ENDPOINT = {
    "type": "object",
    "required": ["name", "url", "shape", "kinds", "enabled"],
    "properties": {
        "name": {"type": "string"},
        "url": {
            "type": "string",
            "description": "a Slack endpoint's shows only its scheme and host (it is stored "
            "sealed)",
        },
        "shape": {"type": "string", "enum": list(notifications.SHAPES)},
        "kinds": {"type": "array", "items": {"type": "string"}},
        "workflow": {"type": ["string", "null"]},
        "enabled": {"type": "boolean"},
        "disabled_reason": {"type": ["string", "null"]},
    },
}
ROTATION = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "url": {
            "type": "string",
            "pattern": notifications.URL.pattern,
            "maxLength": notifications.MAX_URL,
            "description": "a Slack endpoint's new URL (only for the slack shape)",
        },
    },
}
NEW_ENDPOINT = {
    "type": "object",
    "required": ["name", "url", "kinds"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": NAME_PATTERN},
        "url": {
            "type": "string",
            "pattern": notifications.URL.pattern,
            "maxLength": notifications.MAX_URL,
        },
        "shape": {"type": "string", "enum": list(notifications.SHAPES), "default": "standard"},
        "kinds": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "enum": list(notifications.KINDS)},
        },
        "workflow": {
            "type": "string",
            "description": "only this workflow's events; it must exist (else 422)",
        },
    },
}


def paths() -> dict[str, Any]:
    """The notification endpoints' paths."""
    name = path_param("name", {"type": "string", "pattern": NAME_PATTERN}, "The endpoint's name")
    tags = ["notifications"]
    one = json_answer(ENDPOINT, "The endpoint")

    def action(summary: str) -> dict[str, Any]:
        return {"post": on_one(summary, one, tags=tags, parameter=name)}

    return {
        "/api/v1/notifications": {
            "get": endpoint(
                "Notification endpoints (a key for every workflow)",
                {
                    "200": json_answer({"type": "object", "required": ["endpoints"]}, "Endpoints"),
                    **problem_answers(403, *AUTHENTICATED),
                },
                tags=tags,
            ),
            "post": endpoint(
                "Subscribe an endpoint to event kinds; the answer shows its whsec_ signing "
                "secret once",
                {
                    "201": json_answer(ENDPOINT, "Subscribed"),
                    **problem_answers(400, 403, 409, 413, 415, 422, *AUTHENTICATED),
                },
                tags=tags,
                body=NEW_ENDPOINT,
            ),
        },
        "/api/v1/notifications/{name}": {
            "get": on_one(
                "One endpoint and its newest 50 messages (delivery history)",
                one,
                tags=tags,
                parameter=name,
            ),
            "delete": endpoint(
                "Remove an endpoint and its history",
                {"204": {"description": "Removed"}, **problem_answers(403, 404, *AUTHENTICATED)},
                tags=tags,
                parameters=[name],
            ),
        },
        "/api/v1/notifications/{name}/rotate": {
            "post": endpoint(
                "A new whsec_ signing secret, shown once (standard), or a Slack endpoint's new "
                "URL; the old one stops at once (409: the other one for this shape)",
                {"200": one, **problem_answers(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED)},
                tags=tags,
                parameters=[name],
                body=ROTATION,
            ),
        },
        "/api/v1/notifications/{name}/enable": action(
            "Enable an endpoint again (a 410 or long failure disabled it)"
        ),
        "/api/v1/notifications/{name}/disable": action(
            "Disable an endpoint; what waited for it is dropped"
        ),
    }
