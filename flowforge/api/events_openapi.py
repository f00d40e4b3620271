"""The OpenAPI paths of api/events.py (docs/contract.md#events)."""

from __future__ import annotations

from typing import Any

from flowforge.api.openapi_parts import (
    AUTHENTICATED,
    endpoint,
    json_answer,
    listing,
    problem_answers,
)
from flowforge.domain.definitions import bounds

_NAME = {"type": "string", "pattern": bounds.EVENT_NAME_PATTERN}
_KEY = {
    "type": "string",
    "minLength": 1,
    "maxLength": bounds.MAX_EVENT_KEY_CHARS,
    "pattern": bounds.EVENT_TEXT_PATTERN,
}
NEW_EVENT = {
    "type": "object",
    "required": ["name", "key", "payload"],
    "additionalProperties": False,
    "properties": {
        "name": _NAME,
        "key": _KEY | {"description": "the business key, such as an order's id"},
        "payload": {"description": "any JSON (null allowed): the output of the steps that take it"},
        "id": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "pattern": bounds.EVENT_TEXT_PATTERN,
            "description": "the event's identity (the partner's delivery id): the same id "
            "again is a redelivery (200, the same event); absent: a new event each time",
        },
    },
}
SENT = {
    "type": "object",
    "required": ["id", "name", "key", "delivered", "replayed"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "name": {"type": "string"},
        "key": {"type": "string"},
        "delivered": {
            "type": "integer",
            "minimum": 0,
            "description": "how many waiting steps took it now",
        },
        "replayed": {"type": "boolean"},
    },
}
EVENT = {
    "type": "object",
    "required": ["id", "sender", "name", "key", "delivery_id", "received_at", "expires_at"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "sender": {"type": "string", "description": "api, or workflow:<key> for an emitted one"},
        "name": {"type": "string"},
        "key": {"type": "string"},
        "delivery_id": {"type": "string"},
        "payload": {},
        "received_at": {"type": "string", "format": "date-time"},
        "expires_at": {"type": "string", "format": "date-time"},
        "consumed_by": {"type": "integer", "description": "how many steps took it"},
    },
}


def paths() -> dict[str, Any]:
    """`/api/v1/events`: send one, list those kept."""
    tags = ["events"]
    return {
        "/api/v1/events": {
            "post": endpoint(
                "Send an event: kept for FLOWFORGE_EVENT_LOOKBACK_S and taken by every wait "
                "step open for its name and key (a key scoped to workflows reaches only "
                "theirs)",
                {
                    "202": json_answer(SENT, "Received"),
                    "200": json_answer(SENT, "The same id again: nothing changed"),
                    **problem_answers(400, 403, 409, 413, 415, 422, *AUTHENTICATED),
                },
                tags=tags,
                body=NEW_EVENT,
            ),
            "get": endpoint(
                "The events kept, newest first (a key scoped to workflows: those they may "
                "take or emitted)",
                {
                    "200": json_answer(listing("events", EVENT), "Events"),
                    **problem_answers(400, *AUTHENTICATED),
                },
                tags=tags,
                parameters=[
                    {"name": "name", "in": "query", "schema": _NAME},
                    {"name": "key", "in": "query", "schema": _KEY},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 500},
                    },
                ],
            ),
        }
    }
