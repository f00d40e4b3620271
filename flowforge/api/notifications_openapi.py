"""The OpenAPI paths of api/notifications.py (docs/contract.md#notifications), built with
api/openapi.py's own helpers, which it passes in: this module imports none of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def paths(
    operation: Callable[..., dict[str, Any]],
    json: Callable[[dict[str, Any], str], dict[str, Any]],
    problems: Callable[..., dict[str, Any]],
    authenticated: tuple[int, ...],
) -> dict[str, Any]:
    """The paths, from openapi.py's `_operation`, `_json` and `_problems`."""
    name = {
        "name": "name",
        "in": "path",
        "required": True,
        "description": "The endpoint's name",
        "schema": {"type": "string", "pattern": NAME_PATTERN},
    }
    tags = ["notifications"]
    one = json(ENDPOINT, "The endpoint")

    def action(summary: str) -> dict[str, Any]:
        answers = {"200": one, **problems(403, 404, *authenticated)}
        return {"post": operation(summary, answers, tags=tags, parameters=[name])}

    return {
        "/api/v1/notifications": {
            "get": operation(
                "Notification endpoints (a key for every workflow)",
                {
                    "200": json({"type": "object", "required": ["endpoints"]}, "Endpoints"),
                    **problems(403, *authenticated),
                },
                tags=tags,
            ),
            "post": operation(
                "Subscribe an endpoint to event kinds; the answer shows its whsec_ signing "
                "secret once",
                {
                    "201": json(ENDPOINT, "Subscribed"),
                    **problems(400, 403, 409, 413, 415, 422, *authenticated),
                },
                tags=tags,
                body=NEW_ENDPOINT,
            ),
        },
        "/api/v1/notifications/{name}": {
            "get": operation(
                "One endpoint and its newest 50 messages (delivery history)",
                {"200": one, **problems(403, 404, *authenticated)},
                tags=tags,
                parameters=[name],
            ),
            "delete": operation(
                "Remove an endpoint and its history",
                {"204": {"description": "Removed"}, **problems(403, 404, *authenticated)},
                tags=tags,
                parameters=[name],
            ),
        },
        "/api/v1/notifications/{name}/rotate": {
            "post": operation(
                "A new whsec_ signing secret, shown once (standard), or a Slack endpoint's new "
                "URL; the old one stops at once (409: the other one for this shape)",
                {"200": one, **problems(400, 403, 404, 409, 413, 415, 422, *authenticated)},
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
