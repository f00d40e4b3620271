"""The OpenAPI schemas whose bounds are the store's own: a source's subscriptions and
conditions (store/sources.py), a re-ingest's page (usecases/reingest.py). Apart from the
modules the document is written in (openapi_parts, openapi_schemas, openapi_definition),
which import nothing of the store: this module is the document's one tie to it."""

from __future__ import annotations

from typing import Any

from flowforge.api.openapi_parts import KEY_PATTERN, SOURCE_PATH_PATTERN, WEBHOOK_AUTHS, condition
from flowforge.store import sources
from flowforge.usecases import reingest

SOURCE_CONDITIONS = {
    "type": "array",
    "minItems": 1,
    "maxItems": sources.MAX_CONDITIONS,
    "items": condition(
        {
            "type": "string",
            "pattern": SOURCE_PATH_PATTERN,
            "description": "input.<...> (the body) or headers.<lower-case name>",
        }
    ),
}

STORE_BOUND: dict[str, Any] = {
    "SourceDefinition": {
        "type": "object",
        "required": ["subscriptions"],
        "additionalProperties": False,
        "properties": {
            "auth": {"type": "string", "enum": WEBHOOK_AUTHS, "default": "signature"},
            "subscriptions": {
                "type": "array",
                "minItems": 1,
                "maxItems": sources.MAX_SUBSCRIPTIONS,
                "items": {
                    "type": "object",
                    "required": ["workflow"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string", "pattern": KEY_PATTERN},
                        "workflow": {"type": "string", "pattern": KEY_PATTERN},
                        "filter": {
                            "type": "object",
                            "description": '{"all": [When...]} or {"any": [When...]}; paths '
                            "read input.* (the body) or headers.<lower-case name>",
                            "minProperties": 1,
                            "maxProperties": 1,
                            "properties": {
                                "all": SOURCE_CONDITIONS,
                                "any": SOURCE_CONDITIONS,
                            },
                            "additionalProperties": False,
                        },
                    },
                },
            },
        },
    },
    "ReingestRequest": {
        "type": "object",
        "required": ["from", "to"],
        "additionalProperties": False,
        "properties": {
            "from": {"type": "string", "format": "date-time", "description": "received from"},
            "to": {"type": "string", "format": "date-time", "description": "received before"},
            "filter": condition(
                {
                    "type": "string",
                    "pattern": "^input(\\.[A-Za-z0-9_]+)*$",
                    "description": "input or a dotted path into the archived body",
                }
            ),
            "dry_run": {"type": "boolean", "description": "count and sample; create nothing"},
            "after": {"type": "integer", "minimum": 0, "maximum": reingest.MAX_CURSOR},
            "limit": {"type": "integer", "minimum": 1, "maximum": reingest.MAX_PER_REQUEST},
        },
    },
}
