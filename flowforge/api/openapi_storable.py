"""The storable rule of /openapi.json (docs/reference/http-api.md): what PostgreSQL's jsonb
and text cannot hold, every string of the API refuses, and the document says so in every
schema."""

from __future__ import annotations

from typing import Any

from flowforge.api.openapi_parts import (
    ref,
)

# What PostgreSQL's jsonb and text cannot hold, every string of the API refuses (400,
# docs/reference/http-api.md): no NUL and no unpaired UTF-16 surrogate, keys included.
# The pattern states the NUL; the surrogate is stated in words (info.description), as
# ECMA-262 patterns in Unicode mode, which JSON Schema validators use, cannot name one.
STORABLE_TEXT = "^[^\\x00]*$"
JSON_VALUE = {
    "description": "any JSON value PostgreSQL can store: no \\u0000 and no unpaired "
    "surrogate in any string or key (400 otherwise)",
    "anyOf": [
        {"type": ["null", "boolean", "number"]},
        {"type": "string", "pattern": STORABLE_TEXT},
        {"type": "array", "items": ref("JSONValue")},
        {
            "type": "object",
            "propertyNames": {"pattern": STORABLE_TEXT},
            "additionalProperties": ref("JSONValue"),
        },
    ],
}
# Keywords that only describe: a schema made of these alone is "any JSON".
_ANNOTATIONS = {"description", "default", "title", "examples"}
# Subschemas that say what a value must be (`not` and `if` say the opposite or a condition,
# so the storable rule is not added inside them).
_SUBSCHEMA_LISTS = ("oneOf", "anyOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "then", "else", "contains")


def storable(schema: Any) -> None:
    """State the storable rule in every schema of the document: each free string gets
    STORABLE_TEXT, each "any JSON" value, open array's items and open object's extra
    members JSONValue."""
    if not isinstance(schema, dict) or "$ref" in schema:
        return
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types or []
    if not set(schema) - _ANNOTATIONS:
        schema["$ref"] = "#/components/schemas/JSONValue"
        return
    if "string" in types and not {"pattern", "format", "enum", "const"} & set(schema):
        schema["pattern"] = STORABLE_TEXT
    if "array" in types and "items" not in schema and "prefixItems" not in schema:
        schema["items"] = ref("JSONValue")
    if "object" in types and schema.get("additionalProperties", True) is not False:
        schema.setdefault("propertyNames", {"pattern": STORABLE_TEXT})
        if schema.get("additionalProperties", True) is True:
            schema["additionalProperties"] = ref("JSONValue")
    names = schema.get("propertyNames")
    if isinstance(names, dict) and "pattern" not in names:
        names["pattern"] = STORABLE_TEXT
    for key in _SUBSCHEMA_LISTS:
        for sub in schema.get(key, []):
            storable(sub)
    for key in _SUBSCHEMA_ONE:
        storable(schema.get(key))
    for key in ("properties", "dependentSchemas"):
        for sub in schema.get(key, {}).values():
            storable(sub)


def storable_paths(paths: dict[str, Any]) -> None:
    """_storable over every parameter, request body and answer of every operation."""
    for item in paths.values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                storable(parameter["schema"])
            bodies = [operation.get("requestBody", {}), *operation["responses"].values()]
            for body in bodies:
                for media in body.get("content", {}).values():
                    storable(media.get("schema"))
                for header in body.get("headers", {}).values():
                    storable(header["schema"])
