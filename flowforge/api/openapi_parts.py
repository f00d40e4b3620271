"""The pieces every part of /openapi.json (flowforge/api/openapi.py) is written with: the
patterns of keys and ids, the status lists, an operation, its parameters and its refusals.
The patterns are the code's own (model.WORKFLOW_KEY, the definitions' STEP_ID), turned into
JSON Schema."""

from __future__ import annotations

import re
from typing import Any

from flowforge.domain import definitions, model
from flowforge.domain.model import (
    RESOLUTIONS,
    AttemptOutcome,
    ExecutionStatus,
    ItemStatus,
    StepStatus,
    WebhookAuth,
)
from flowforge.domain.operations import Action, Kind
from flowforge.domain.roles import Role


def whole(pattern: re.Pattern[str]) -> str:
    """A regex the code matches whole (fullmatch) as a JSON Schema pattern, which searches."""
    return f"^{pattern.pattern}$"


KEY_PATTERN = whole(model.WORKFLOW_KEY)
# An executions cursor: an execution id's 16 bytes in unpadded URL-safe base64
# (store/timeline.encode_cursor), opaque to clients.
CURSOR_PATTERN = "^([A-Za-z0-9_-]{22})?$"
# A dotted context path (domain/templating.is_path): segments of A-Z a-z 0-9 _ -, none
# starting with two underscores.
_SEGMENT = "([A-Za-z0-9-][A-Za-z0-9_-]*|_([A-Za-z0-9-][A-Za-z0-9_-]*)?)"
CONTEXT_PATH_PATTERN = f"^{_SEGMENT}(\\.{_SEGMENT})*$"
SOURCE_PATH_PATTERN = f"^(input|headers)(\\.{_SEGMENT})*$"
STEP_ID_PATTERN = whole(definitions.STEP_ID)
# A step row: a step of the workflow, or one of a map's items' (`lines[3].reserve`).
STEP_ROW_PATTERN = f"^({definitions.STEP_ID.pattern}|{definitions.ITEM_ROW.pattern})$"
ITEM_STATUSES = [status.value for status in ItemStatus]
# docs/contract.md#search-attributes: a search attribute's name, and the values an
# execution's attributes (and a filter by them) hold.
ATTRIBUTE_NAME_PATTERN = f"^{definitions.ATTRIBUTE_NAME}$"
ATTRIBUTE_VALUES = {
    "type": "object",
    "maxProperties": definitions.MAX_ATTRIBUTES,
    "propertyNames": {"pattern": ATTRIBUTE_NAME_PATTERN},
    "additionalProperties": {
        "type": "string",
        "minLength": 1,
        "maxLength": definitions.MAX_ATTRIBUTE_CHARS,
    },
}
# The list's filter by search attributes: each property is sent as its own query parameter
# `attr.NAME=VALUE` (x-flowforge-prefix; the generated client spells them so), all of which
# an execution must have. A name or value no attribute could have is a 422 naming it.
ATTRIBUTE_FILTER = {
    "name": "attr",
    "in": "query",
    "style": "form",
    "explode": True,
    "x-flowforge-prefix": "attr.",
    "description": "attr.NAME=VALUE, repeatable for different names: only executions whose "
    "search attribute NAME is VALUE (all of them); 422 names a bad one by its parameter",
    "schema": ATTRIBUTE_VALUES,
}
STATUSES = [status.value for status in ExecutionStatus]
STEP_STATUSES = [status.value for status in StepStatus]
OUTCOMES = [outcome.value for outcome in AttemptOutcome]
WEBHOOK_AUTHS = [auth.value for auth in WebhookAuth]

PROBLEM_TEXT = {
    400: "Malformed JSON or an invalid parameter",
    401: "Missing, invalid or revoked credentials (API key or webhook signature)",
    403: (
        "The API key's role (required_role names the one needed) or its workflow scope "
        "does not allow this"
    ),
    404: "No such resource",
    405: "Method not allowed on this resource",
    409: "Conflict with the current state",
    410: "Gone: the wait is over (timed out, cancelled, completed, or its execution ended)",
    413: "Body larger than FLOWFORGE_MAX_BODY_BYTES",
    415: "Not identity-encoded application/json",
    422: "Invalid definition or request body; one entry in errors per problem",
    503: (
        "The database cannot be reached (retry after Retry-After seconds), or signing "
        "secrets cannot be opened (FLOWFORGE_ENCRYPTION_KEY missing or wrong)"
    ),
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_answer(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def problem_answers(*statuses: int) -> dict[str, Any]:
    """Error answers, all RFC 9457 problem details."""
    return {
        str(status): {
            "description": PROBLEM_TEXT[status],
            "content": {"application/problem+json": {"schema": ref("Problem")}},
        }
        for status in statuses
    }


def path_param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": schema,
    }


WORKFLOW_KEY = path_param(
    "key", {"type": "string", "pattern": KEY_PATTERN}, "The workflow key, e.g. order-sync"
)
SOURCE_NAME = path_param(
    "name", {"type": "string", "pattern": KEY_PATTERN}, "The source name, e.g. github"
)
EXECUTION_ID = path_param("id", {"type": "string", "format": "uuid"}, "The execution id")
AUTHENTICATED = (401, 503)


def endpoint(
    summary: str,
    responses: dict[str, Any],
    *,
    tags: list[str],
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    public: bool = False,
) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "tags": tags, "responses": responses}
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    if public:
        operation["security"] = []
    return operation


def listing(field: str, item: dict[str, Any]) -> dict[str, Any]:
    """The answer of a list route: an object holding the list under `field`, never a bare
    array, so that a list route can answer more fields (a cursor) later."""
    return {
        "type": "object",
        "required": [field],
        "properties": {field: {"type": "array", "items": item}},
    }


def on_one(
    summary: str, answer: dict[str, Any], *, tags: list[str], parameter: dict[str, Any]
) -> dict[str, Any]:
    """A bodiless operation on the one resource its path names, answering it (200) or 404
    (403 for a key that may not): reading one, or a state change such as a failure group's
    resolve or an endpoint's enable. The routes of that kind are described alike."""
    answers = {"200": answer, **problem_answers(403, 404, *AUTHENTICATED)}
    return endpoint(summary, answers, tags=tags, parameters=[parameter])


STEP_PARAM = path_param("step", {"type": "string", "pattern": STEP_ID_PATTERN}, "Step id")
STEP_ROW_PARAM = path_param(
    "step", {"type": "string", "pattern": STEP_ROW_PATTERN}, "Step id or item step"
)


def any_case(words: tuple[str, ...]) -> str:
    """A pattern matching any of these words in any letter case, as `definitions` compares."""
    spelled = ("".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in w) for w in words)
    return f"^({'|'.join(spelled)})$"


def seconds(maximum: float, *, zero: bool = False) -> dict[str, Any]:
    """A number of seconds up to `maximum`, from 0 (`zero`) or above it."""
    low = {"minimum": 0} if zero else {"exclusiveMinimum": 0}
    return {"type": "number", **low, "maximum": maximum}


def condition(path: dict[str, Any]) -> dict[str, Any]:
    """A condition (a step's `when`, a source subscription's filter) over `path`."""
    return {
        "type": "object",
        "required": ["path", "op"],
        "additionalProperties": False,
        "properties": {
            "path": path,
            "op": {"type": "string", "enum": list(definitions.OPS)},
            "value": {"description": "required unless op is exists; an array for in"},
        },
        "allOf": [
            {
                "if": {"properties": {"op": {"not": {"const": "exists"}}}},
                "then": {"required": ["value"]},
            },
            {
                "if": {"properties": {"op": {"const": "in"}}},
                "then": {"properties": {"value": {"type": "array"}}},
            },
            {
                "if": {"properties": {"op": {"enum": ["gt", "gte", "lt", "lte"]}}},
                "then": {"properties": {"value": {"type": ["number", "string"]}}},
            },
        ],
    }


def action_body(action: Action) -> dict[str, Any]:
    """The schema of an action's body: its declared fields, no other."""
    properties: dict[str, Any] = {}
    for param in action.fields:
        properties[param.field] = {"description": param.help}
        if param.kind is Kind.OUTCOME:
            properties[param.field] |= {"type": "string", "enum": list(RESOLUTIONS)}
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False}
    required = [p.field for p in action.fields if p.kind is Kind.OUTCOME]
    if required:
        schema["required"] = required
    return schema | {"properties": properties}


WEBHOOK_HEADERS = [
    {
        "name": "webhook-id",
        "in": "header",
        "description": "Standard Webhooks message id; doubles as the idempotency key",
        "schema": {"type": "string", "maxLength": model.MAX_IDEMPOTENCY_KEY},
    },
    {
        "name": "webhook-timestamp",
        "in": "header",
        "description": "Unix seconds; must be within 5 minutes of the server's clock",
        "schema": {"type": "string", "pattern": "^[0-9]{1,15}$"},
    },
    {
        "name": "webhook-signature",
        "in": "header",
        "description": "Space-separated v1,<base64 HMAC-SHA256 of id.timestamp.body>",
        "schema": {"type": "string"},
    },
    {
        "name": "Idempotency-Key",
        "in": "header",
        "description": (
            "The idempotency key of a workflow with auth none (else webhook-id is); ignored "
            "for signed workflows, whose identity is the signed webhook-id alone"
        ),
        "schema": {"type": "string", "minLength": 1, "maxLength": model.MAX_IDEMPOTENCY_KEY},
    },
]


def operation_id(method: str, path: str) -> str:
    """A stable snake_case name for an operation, which generated clients use as their
    method name: the method, then the path's words, each parameter as by_<name>
    (POST /api/v1/workflows/{key}/versions is post_workflows_by_key_versions)."""
    words = [method]
    for segment in path.strip("/").split("/"):
        if segment in ("api", "v1"):
            continue
        if segment.startswith("{"):
            segment = f"by_{segment[1:-1]}"
        words.append(re.sub("[^a-z0-9]+", "_", segment.lower()))
    return "_".join(words)


# RFC 9457 problem details, the one shape an error leaves in (flowforge/api/problems.py).
PROBLEM = {
    "type": "object",
    "description": "RFC 9457 problem details",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["path", "message"],
                "properties": {"path": {"type": "string"}, "message": {"type": "string"}},
            },
        },
        "required_role": {
            "type": "string",
            "enum": [role.value for role in Role],
            "description": "403 for the key's role: the least role the route needs",
        },
        "role": {
            "type": "string",
            "enum": [role.value for role in Role],
            "description": "403 for the key's role: the role the key has",
        },
    },
}
