"""GET /openapi.json: a hand-written OpenAPI 3.1 description of the whole HTTP API.

Written by hand rather than generated so that it states the contract (docs/contract.md#http-api)
instead of echoing whatever the code happens to do; tests/integration/test_fuzz_api.py runs
schemathesis against a live bin/api from this document, so a route missing here is a
route nobody fuzzes.
"""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, Response, jsonify

from flowforge.api.bodies import MAX_SECRET, MIN_SECRET
from flowforge.domain import definitions, model
from flowforge.domain.model import (
    RESOLUTIONS,
    AttemptOutcome,
    ExecutionStatus,
    ItemStatus,
    StepStatus,
    WebhookAuth,
)
from flowforge.domain.operations import ACTIONS, Action, Kind
from flowforge.store import sources
from flowforge.usecases import reingest

bp = Blueprint("openapi", __name__)


def _whole(pattern: re.Pattern[str]) -> str:
    """A regex the code matches whole (fullmatch) as a JSON Schema pattern, which searches."""
    return f"^{pattern.pattern}$"


KEY_PATTERN = _whole(model.WORKFLOW_KEY)
# An executions cursor: an execution id's 16 bytes in unpadded URL-safe base64
# (store/timeline.encode_cursor), opaque to clients.
CURSOR_PATTERN = "^([A-Za-z0-9_-]{22})?$"
# A dotted context path (domain/templating.is_path): segments of A-Z a-z 0-9 _ -, none
# starting with two underscores.
_SEGMENT = "([A-Za-z0-9-][A-Za-z0-9_-]*|_([A-Za-z0-9-][A-Za-z0-9_-]*)?)"
CONTEXT_PATH_PATTERN = f"^{_SEGMENT}(\\.{_SEGMENT})*$"
SOURCE_PATH_PATTERN = f"^(input|headers)(\\.{_SEGMENT})*$"
STEP_ID_PATTERN = _whole(definitions.STEP_ID)
# A step row: a step of the workflow, or one of a map's items' (`lines[3].reserve`).
STEP_ROW_PATTERN = f"^({definitions.STEP_ID.pattern}|{definitions.ITEM_ROW.pattern})$"
ITEM_STATUSES = [status.value for status in ItemStatus]
STATUSES = [status.value for status in ExecutionStatus]
STEP_STATUSES = [status.value for status in StepStatus]
OUTCOMES = [outcome.value for outcome in AttemptOutcome]
WEBHOOK_AUTHS = [auth.value for auth in WebhookAuth]

PROBLEM_TEXT = {
    400: "Malformed JSON or an invalid parameter",
    401: "Missing, invalid or revoked credentials (API key or webhook signature)",
    403: "The API key's scope does not allow this",
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


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _problems(*statuses: int) -> dict[str, Any]:
    """Error answers, all RFC 9457 problem details."""
    return {
        str(status): {
            "description": PROBLEM_TEXT[status],
            "content": {"application/problem+json": {"schema": _ref("Problem")}},
        }
        for status in statuses
    }


def _path_param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": schema,
    }


WORKFLOW_KEY = _path_param(
    "key", {"type": "string", "pattern": KEY_PATTERN}, "The workflow key, e.g. order-sync"
)
SOURCE_NAME = _path_param(
    "name", {"type": "string", "pattern": KEY_PATTERN}, "The source name, e.g. github"
)
EXECUTION_ID = _path_param("id", {"type": "string", "format": "uuid"}, "The execution id")
AUTHENTICATED = (401, 503)


def _operation(
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


STEP_PARAM = _path_param("step", {"type": "string", "pattern": STEP_ID_PATTERN}, "Step id")
STEP_ROW_PARAM = _path_param(
    "step", {"type": "string", "pattern": STEP_ROW_PATTERN}, "Step id or item step"
)


def _action(action: Action) -> dict[str, Any]:
    """A declared operator action (flowforge/domain/operations.py) as its path's item: a
    POST answered with an ActionResult or a refusal; a body with its fields as declared."""
    step = action.step
    parameters = [EXECUTION_ID]
    if step is not None:
        parameters.append(STEP_ROW_PARAM if step.kind is Kind.STEP_ROW else STEP_PARAM)
    if action.body is not None:
        SCHEMAS[action.body] = _body(action)
    answers = {code: _json(_ref("ActionResult"), text) for code, text in action.answers.items()}
    refusals = _problems(
        *sorted({403, *action.refusals, *(() if action.body is None else (400, 413, 415, 422))}),
        *AUTHENTICATED,
    )
    return {
        "post": _operation(
            action.summary,
            {**answers, **refusals},
            tags=["executions"],
            parameters=parameters,
            body=None if action.body is None else _ref(action.body),
        )
    }


def _body(action: Action) -> dict[str, Any]:
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


def _group_key(description: str) -> dict[str, Any]:
    """A debounce or batch group's `key`: a template over input only."""
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": definitions.MAX_TEMPLATE_CHARS,
        "description": f"a template over input only: {description}",
    }


GROUP_WINDOW = {
    "type": "number",
    "minimum": definitions.MIN_GROUP_WINDOW_S,
    "maximum": definitions.MAX_GROUP_WINDOW_S,
}


def _any_case(words: tuple[str, ...]) -> str:
    """A pattern matching any of these words in any letter case, as `definitions` compares."""
    spelled = ("".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in w) for w in words)
    return f"^({'|'.join(spelled)})$"


def _step(step_type: str, description: str, required: list[str], **fields: Any) -> dict[str, Any]:
    """One step type's object: the common fields and its own, and nothing else (like
    `definitions`, which rejects a field another type owns as an unknown key)."""
    return {
        "type": "object",
        "description": description,
        "required": ["id", "type", *required],
        "additionalProperties": False,
        "properties": {
            "id": {
                "type": "string",
                "pattern": STEP_ID_PATTERN,
                "not": {"enum": sorted(definitions.RESERVED_NAMES)},
            },
            "type": {"const": step_type},
            "depends_on": {
                "type": "array",
                "maxItems": definitions.MAX_PARENTS,
                "uniqueItems": True,
                "items": {"type": "string", "description": "the id of another step"},
            },
            "when": _ref("When"),
            **fields,
        },
    }


def _seconds(maximum: float, *, zero: bool = False) -> dict[str, Any]:
    """A number of seconds up to `maximum`, from 0 (`zero`) or above it."""
    low = {"minimum": 0} if zero else {"exclusiveMinimum": 0}
    return {"type": "number", **low, "maximum": maximum}


def _when(path: dict[str, Any]) -> dict[str, Any]:
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


WHEN_PATH = {
    "type": "string",
    "pattern": CONTEXT_PATH_PATTERN,
    "description": "a dotted context path, no braces, naming input, an upstream step or "
    "another name in scope (422 otherwise)",
}
SOURCE_CONDITIONS = {
    "type": "array",
    "minItems": 1,
    "maxItems": sources.MAX_CONDITIONS,
    "items": _when(
        {
            "type": "string",
            "pattern": SOURCE_PATH_PATTERN,
            "description": "input.<...> (the body) or headers.<lower-case name>",
        }
    ),
}


# The definition format (docs/contract.md#definition), checked field by field against what
# flowforge/domain/definitions.py accepts by tests/unit/test_openapi_definitions.py: a field,
# a bound or an enum value that one accepts and the other does not fails that test. What a
# schema cannot say (the graph, template scopes, header names, string and nesting limits)
# the API still answers with 422.
STEP_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "http_request": (
        "HttpRequestStep",
        _step(
            "http_request",
            "Sends one HTTP request, retried by its policy",
            ["request"],
            request=_ref("Request"),
            retry=_ref("Retry"),
            budget_s=_seconds(definitions.MAX_TIME_LIMIT_S)
            | {"description": "all attempts together; at least one attempt's timeout_s"},
            limit={
                "type": "string",
                "description": "the name of one of the definition's limits",
            },
        ),
    ),
    "delay": (
        "DelayStep",
        _step(
            "delay",
            "Waits for a duration or until an instant: exactly one of duration_s and until",
            [],
            duration_s=_seconds(definitions.MAX_DELAY_S, zero=True),
            until={"type": "string", "description": "ISO-8601 instant with a zone, or a template"},
        )
        | {"oneOf": [{"required": ["duration_s"]}, {"required": ["until"]}]},
    ),
    "transform": (
        "TransformStep",
        _step(
            "transform",
            "Computes its output from templates",
            ["output"],
            output={"description": "any JSON; templates resolved inside strings"},
        ),
    ),
    "wait": (
        "WaitStep",
        _step(
            "wait",
            "Waits for a resume (POST to its resume URL) or its timeout",
            ["timeout_s"],
            timeout_s=_seconds(definitions.MAX_WAIT_S),
            on_timeout={"type": "string", "enum": list(definitions.ON_TIMEOUT), "default": "fail"},
            auth={
                "type": "string",
                "enum": list(definitions.RESUME_AUTH),
                "default": "token",
                "description": "whether a resume must also be signed",
            },
        ),
    ),
    "map": (
        "MapStep",
        _step(
            "map",
            "Runs its steps once per item of an array, at most max_parallel items at a time; "
            "its output is the list of each item's last step output, in order",
            ["items", "steps"],
            items={
                "oneOf": [
                    {"type": "array", "maxItems": definitions.MAX_MAP_ITEMS},
                    {"type": "string", "pattern": "^[^\\x00]*\\{\\{[^\\x00]*$"},
                ],
                "description": "an array, or a template that renders one (at most "
                f"{definitions.MAX_MAP_ITEMS} items; more fails the map when it starts)",
            },
            steps={
                "type": "array",
                "minItems": 1,
                "items": _ref("ItemStep"),
                "description": "what each item runs; templates read {{ item }} and {{ index }}",
            },
            max_parallel={
                "type": "integer",
                "minimum": 1,
                "maximum": definitions.MAX_MAP_PARALLEL,
                "default": definitions.DEFAULT_MAP_PARALLEL,
            },
            on_item_failure={
                "type": "string",
                "enum": list(definitions.ON_ITEM_FAILURE),
                "default": "fail_fast",
                "description": "fail_fast: the first failed item fails the map and cancels "
                "the rest; collect: every item runs, then the map fails if one did",
            },
        ),
    ),
    "workflow": (
        "WorkflowStep",
        _step(
            "workflow",
            "Starts an execution of another workflow's newest version (its child, pinned to "
            "that version), waits for it to end without holding a thread, and takes its "
            "output: the output of the child's last step in definition order. A "
            "failed or cancelled child fails the step; a child that needs attention keeps "
            "it waiting until an operator resolves the child",
            ["workflow"],
            workflow={
                "type": "string",
                "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$",
                "description": "the key of the workflow to start; a cycle of workflows "
                "calling each other is refused at publish",
            },
            input={
                "description": "the child's input, any JSON; templates resolved inside "
                "strings (default {})",
            },
        ),
    ),
}

DEFINITION_SCHEMAS: dict[str, Any] = {
    "ItemStep": {
        "oneOf": [_ref(STEP_SCHEMAS[step_type][0]) for step_type in definitions.ITEM_STEP_TYPES],
        "description": "a step of a map's items: http_request, delay or transform",
    },
    "Request": {
        "type": "object",
        "required": ["url"],
        "additionalProperties": False,
        "not": {"required": ["json", "body"]},
        "properties": {
            "method": {
                "type": "string",
                "pattern": _any_case(definitions.METHODS),
                "default": "GET",
                "description": "any letter case",
            },
            "url": {"type": "string", "description": "http(s) URL; may hold {{ path }} templates"},
            "headers": {
                "type": "object",
                # `not` a search for CR or LF: "^[^\r\n]*$" would let Python's `$` pass a final LF.
                "additionalProperties": {"type": "string", "not": {"pattern": "[\r\n]"}},
            },
            "json": {"description": "JSON body, templates resolved inside values"},
            "body": {"type": "string"},
            "timeout_s": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": definitions.MAX_REQUEST_TIMEOUT_S,
                "default": definitions.DEFAULT_REQUEST_TIMEOUT_S,
            },
            "idempotency_key": {"type": "string", "minLength": 1},
            "allow_templated_destination": {
                "type": "boolean",
                "default": False,
                "description": "let a request that carries a secret or a resume URL take its "
                "scheme, host or port from the execution's data",
            },
        },
    },
    "Retry": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "max_attempts": {"type": "integer", "minimum": 1, "maximum": definitions.MAX_ATTEMPTS},
            "initial_interval_s": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": definitions.MAX_INITIAL_INTERVAL_S,
            },
            "backoff_coefficient": {
                "type": "number",
                "minimum": definitions.MIN_BACKOFF_COEFFICIENT,
                "maximum": definitions.MAX_BACKOFF_COEFFICIENT,
            },
            "max_interval_s": {
                "type": "number",
                "maximum": definitions.MAX_RETRY_INTERVAL_S,
                "description": "at least initial_interval_s",
            },
            "on_exhausted": {
                "type": "string",
                "enum": list(definitions.ON_EXHAUSTED),
                "default": "fail",
                "description": "when the tries run out: fail the execution, or pause it "
                "at this step for an operator",
            },
        },
    },
    "When": _when(WHEN_PATH),
    "Step": {
        "oneOf": [_ref(name) for name, _ in STEP_SCHEMAS.values()],
        "discriminator": {
            "propertyName": "type",
            "mapping": {
                step_type: f"#/components/schemas/{name}"
                for step_type, (name, _) in STEP_SCHEMAS.items()
            },
        },
    },
    **{name: schema for name, schema in STEP_SCHEMAS.values()},
    "Concurrency": {
        "type": "object",
        "description": "how many executions (per key value) run at once",
        "required": ["limit"],
        "additionalProperties": False,
        "properties": {
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": definitions.MAX_CONCURRENCY_LIMIT,
            },
            "key": {
                "type": "string",
                "minLength": 1,
                "maxLength": definitions.MAX_TEMPLATE_CHARS,
                "description": "a template over input only, such as {{ input.customer }}",
            },
            "on_full": {"type": "string", "enum": list(definitions.ON_FULL), "default": "queue"},
            "max_queued": {"type": "integer", "minimum": 1, "maximum": definitions.MAX_QUEUED},
        },
    },
    "Debounce": {
        "type": "object",
        "description": "the last event of a quiet window starts one execution (that "
        "event plus `debounced`, how many earlier ones it stands for); the others are recorded "
        "against it",
        "required": ["window_s"],
        "additionalProperties": False,
        "properties": {
            "key": _group_key("one group per value"),
            "window_s": GROUP_WINDOW,
            "max_wait_s": {
                "type": "number",
                "minimum": definitions.MIN_GROUP_WINDOW_S,
                "maximum": definitions.MAX_DEBOUNCE_WAIT_S,
                "description": "at least window_s; the group starts at the latest this long after "
                "its first event (default: ten windows)",
            },
        },
    },
    "Batch": {
        "type": "object",
        "description": "one execution per max_items events, or per window_s after "
        "the first, with input.events[] in arrival order",
        "required": ["max_items", "window_s"],
        "additionalProperties": False,
        "properties": {
            "key": _group_key("one batch per value"),
            "max_items": {"type": "integer", "minimum": 1, "maximum": definitions.MAX_BATCH_ITEMS},
            "window_s": GROUP_WINDOW,
        },
    },
    "Limit": {
        "type": "object",
        "description": "the workflow's own outbound limit, counted over every "
        "worker; at least one of rate_per_s, concurrency and circuit",
        "additionalProperties": False,
        "anyOf": [
            {"required": ["rate_per_s"]},
            {"required": ["concurrency"]},
            {"required": ["circuit"]},
        ],
        "dependentRequired": {"burst": ["rate_per_s"]},
        "properties": {
            "rate_per_s": {
                "type": "number",
                "minimum": definitions.MIN_LIMIT_RATE,
                "maximum": definitions.MAX_LIMIT_RATE,
                "description": "per second, at least one an hour",
            },
            "burst": {"type": "integer", "minimum": 1, "maximum": definitions.MAX_LIMIT_RATE},
            "concurrency": {
                "type": "integer",
                "minimum": 1,
                "maximum": definitions.MAX_LIMIT_RATE,
            },
            "circuit": {
                "type": "object",
                "required": ["failures", "window_s", "cool_down_s"],
                "additionalProperties": False,
                "properties": {
                    "failures": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": definitions.MAX_CIRCUIT_FAILURES,
                    },
                    "window_s": _seconds(definitions.MAX_CIRCUIT_S),
                    "cool_down_s": _seconds(definitions.MAX_CIRCUIT_S),
                },
            },
            "max_hold_s": _seconds(definitions.MAX_HOLD_S, zero=True)
            | {
                "description": "the longest a 429/503's Retry-After holds the key "
                "(default and most: 3600; 0: never)"
            },
        },
    },
    "SharedLimit": {
        "type": "object",
        "description": "opts into a limit the operator shares with this workflow "
        "(FLOWFORGE_SHARED_LIMITS); its bounds are the operator's",
        "required": ["shared"],
        "additionalProperties": False,
        "properties": {
            "shared": {
                "type": "string",
                "pattern": "^" + definitions.SHARED_LIMIT_NAME.pattern + "$",
            }
        },
    },
    "Definition": {
        "type": "object",
        "required": ["name", "steps"],
        "additionalProperties": False,
        "properties": {
            "name": {
                "type": "string",
                "minLength": 1,
                "maxLength": definitions.MAX_NAME_CHARS,
                "pattern": "^[^\\x00]*[^\\x00\\s][^\\x00]*$",
            },
            "description": {"type": "string"},
            "trigger": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": False,
                "properties": {
                    "webhook": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "auth": {
                                "type": "string",
                                "enum": WEBHOOK_AUTHS,
                                "default": "signature",
                                "description": "signature: Standard Webhooks; stripe, github, "
                                "shopify, slack: the provider's own scheme",
                            },
                            "debounce": _ref("Debounce"),
                            "batch": _ref("Batch"),
                        },
                        "not": {"required": ["debounce", "batch"]},
                    },
                    "schedule": _ref("ScheduleDefinition"),
                },
            },
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": definitions.MAX_STEPS,
                "items": _ref("Step"),
            },
            "concurrency": _ref("Concurrency"),
            "deadline_s": _seconds(definitions.MAX_TIME_LIMIT_S)
            | {"description": "the whole execution must end within this"},
            "start_within_s": _seconds(definitions.MAX_TIME_LIMIT_S)
            | {"description": "the execution must start within this"},
            "retention_days": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": definitions.MAX_RETENTION_DAYS,
                "default": definitions.DEFAULT_RETENTION_DAYS,
                "description": "how long finished executions are kept; fractions allowed",
            },
            "archive_days": {
                "type": "number",
                "minimum": 0,
                "maximum": definitions.MAX_RETENTION_DAYS,
                "default": 0,
                "description": "days each accepted webhook's raw request is kept for "
                "re-ingest; 0 keeps none",
            },
            "priority": {
                "description": "higher is claimed first among ready steps, with "
                "ageing (FLOWFORGE_PRIORITY_AGEING_S seconds of waiting are worth one "
                "point); an integer, or {{ input.<path> }} rendered once when the execution "
                "is created (absent or null: 0; anything else that is not an integer in "
                "range refuses the webhook with 422)",
                "default": definitions.DEFAULT_PRIORITY,
                "oneOf": [
                    {
                        "type": "integer",
                        "minimum": definitions.MIN_PRIORITY,
                        "maximum": definitions.MAX_PRIORITY,
                    },
                    {"type": "string", "pattern": r"^\{\{\s*input\.[A-Za-z0-9_.-]+\s*\}\}$"},
                ],
            },
            "limits": {
                "type": "object",
                "description": "named outbound limits; a name with "
                "{{ input.x }} keys one limit per value",
                "maxProperties": definitions.MAX_LIMITS,
                "propertyNames": {"minLength": 1, "not": {"pattern": "^host:"}},
                "additionalProperties": {"oneOf": [_ref("Limit"), _ref("SharedLimit")]},
            },
            "input_schema": {
                "type": ["object", "boolean"],
                "description": "JSON Schema 2020-12 every webhook body must satisfy (422 "
                "with each error's path otherwise); local $ref only",
            },
        },
    },
    "ScheduleDefinition": {
        "type": "object",
        "description": "exactly one of cron (five fields) and every_s",
        "additionalProperties": False,
        "oneOf": [{"required": ["cron"]}, {"required": ["every_s"]}],
        "properties": {
            "cron": {"type": "string", "examples": ["*/5 * * * *"]},
            "every_s": {"type": "integer", "minimum": 1, "maximum": definitions.MAX_EVERY_S},
            "timezone": {
                "type": "string",
                "description": "an IANA zone the server's tz database knows",
                "default": "UTC",
                "examples": ["Europe/Lisbon"],
            },
            "overlap": {"type": "string", "enum": list(definitions.OVERLAP), "default": "skip"},
            "catchup_window_s": {
                "type": "number",
                "minimum": 1,
                "maximum": definitions.MAX_CATCHUP_WINDOW_S,
                "default": definitions.DEFAULT_CATCHUP_WINDOW_S,
            },
            "jitter_s": {
                "type": "number",
                "minimum": 0,
                "maximum": definitions.MAX_JITTER_S,
                "default": 0,
            },
            "input": {"type": "object", "description": "each tick's input, plus scheduled_at"},
        },
    },
}


SCHEMAS: dict[str, Any] = {
    "Problem": {
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
        },
    },
    **DEFINITION_SCHEMAS,
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
    "Source": {
        "type": "object",
        "properties": {
            "source": {"type": "string"},
            "auth": {"type": "string", "enum": WEBHOOK_AUTHS},
            "subscriptions": {"type": "array", "items": {"type": "object"}},
            "revision": {"type": "integer"},
            "active_secrets": {"type": "array", "items": {"type": "integer"}},
        },
    },
    "Tick": {
        "type": "object",
        "required": ["tick_at", "outcome"],
        "properties": {
            "tick_at": {"type": "string", "format": "date-time"},
            "outcome": {
                "type": "string",
                "description": "fired, skipped, buffered, missed, paused; pause and resume "
                "for operator actions; in a backfill also 'would fire' and 'fired already'",
            },
            "execution_id": {"type": ["string", "null"], "format": "uuid"},
            "reason": {"type": ["string", "null"]},
            "actor": {"type": ["object", "null"]},
            "lag_s": {"type": ["number", "null"]},
            "created_at": {"type": "string", "format": "date-time"},
        },
    },
    "Schedule": {
        "type": "object",
        "required": ["workflow", "schedule", "paused", "next", "ledger"],
        "properties": {
            "workflow": {"type": "string"},
            "version": {"type": "integer"},
            "schedule": _ref("ScheduleDefinition"),
            "timezone": {"type": "string"},
            "paused": {"type": "boolean"},
            "paused_at": {"type": ["string", "null"], "format": "date-time"},
            "paused_by": {"type": ["object", "null"]},
            "next": {
                "type": "array",
                "description": "the next 10 ticks: UTC instant, local time, fire time (jitter)",
                "items": {
                    "type": "object",
                    "properties": {
                        "tick_at": {"type": "string", "format": "date-time"},
                        "local": {"type": "string", "format": "date-time"},
                        "fires_at": {"type": "string", "format": "date-time"},
                    },
                },
            },
            "ledger": {"type": "array", "items": _ref("Tick"), "description": "newest first, 100"},
        },
    },
    "Published": {
        "type": "object",
        "required": ["workflow", "version"],
        "properties": {
            "workflow": {"type": "string"},
            "version": {"type": "integer"},
            "name": {"type": "string"},
            "webhook_auth": {"type": "string", "enum": WEBHOOK_AUTHS},
            "steps": {"type": "array", "items": {"type": "string"}},
            "created_at": {"type": "string", "format": "date-time"},
            "warning": {
                "type": "string",
                "description": "Only when the definition has no trigger, so that every "
                "webhook needs a signature",
            },
        },
    },
    "Workflow": {
        "type": "object",
        "properties": {
            "workflow": {"type": "string"},
            "latest_version": {"type": "integer"},
            "created_at": {"type": "string", "format": "date-time"},
            "versions": {"type": "array", "items": {"type": "object"}},
            "paused": {
                "type": ["object", "null"],
                "description": "since when and by whom the workflow is paused",
            },
        },
    },
    "ReplayRequest": {
        "type": "object",
        "required": ["from_step"],
        "additionalProperties": False,
        "properties": {
            "from_step": {"type": "string", "pattern": STEP_ID_PATTERN},
            "version": {
                "oneOf": [
                    {"type": "integer", "minimum": 1, "maximum": model.MAX_VERSION},
                    {"const": "latest"},
                ],
                "description": "the version to run the rest on (default: latest)",
            },
        },
    },
    "Replayed": {
        "type": "object",
        "required": ["execution_id", "replay_of", "from_step", "version", "status"],
        "properties": {
            "execution_id": {"type": "string", "format": "uuid"},
            "replay_of": {"type": "string", "format": "uuid"},
            "from_step": {"type": "string"},
            "version": {"type": "integer"},
            "status": {"type": "string", "enum": STATUSES},
        },
    },
    "BulkReplayRequest": {
        "type": "object",
        "required": ["filter", "from_step"],
        "additionalProperties": False,
        "description": "a dry run (dry_run true) or a confirmed batch (the upto a dry run "
        "answered); the version must exist (422 otherwise)",
        "anyOf": [
            {"required": ["dry_run"], "properties": {"dry_run": {"const": True}}},
            {"required": ["upto"]},
        ],
        "properties": {
            "filter": {
                "type": "object",
                "required": ["workflow"],
                "additionalProperties": False,
                "properties": {
                    "workflow": {"type": "string", "pattern": KEY_PATTERN},
                    "version": {"type": "integer", "minimum": 1, "maximum": model.MAX_VERSION},
                    "status": {"type": "string", "enum": STATUSES},
                    "from": {"type": "string", "format": "date-time"},
                    "to": {"type": "string", "format": "date-time"},
                    "error": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": model.MAX_ERROR_FILTER_CHARS,
                    },
                },
            },
            "from_step": {"type": "string", "pattern": STEP_ID_PATTERN},
            "version": {
                "oneOf": [
                    {"type": "integer", "minimum": 1, "maximum": model.MAX_VERSION},
                    {"const": "latest"},
                ]
            },
            "dry_run": {"type": "boolean", "description": "preview: the count and the upto"},
            "upto": {
                "type": "string",
                "format": "uuid",
                "description": "the confirmation: the upto of a dry run",
            },
            "after": {"type": ["string", "null"], "format": "uuid"},
            "limit": {"type": "integer", "minimum": 1, "maximum": model.MAX_PAGE},
        },
    },
    "BulkReplayResult": {
        "type": "object",
        "required": ["dry_run"],
        "properties": {
            "dry_run": {"type": "boolean"},
            "count": {"type": "integer"},
            "upto": {"type": ["string", "null"]},
            "replayed": {"type": "array", "items": {"type": "string", "format": "uuid"}},
            "refused": {"type": "array", "items": {"type": "object"}},
            "next_after": {"type": ["string", "null"]},
        },
    },
    "ReingestRequest": {
        "type": "object",
        "required": ["from", "to"],
        "additionalProperties": False,
        "properties": {
            "from": {"type": "string", "format": "date-time", "description": "received from"},
            "to": {"type": "string", "format": "date-time", "description": "received before"},
            "filter": _when(
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
    "ReingestResult": {
        "type": "object",
        "required": ["dry_run", "matched", "next"],
        "properties": {
            "dry_run": {"type": "boolean"},
            "matched": {"type": "integer"},
            "already_reingested": {"type": "integer"},
            "next": {"type": ["integer", "null"], "description": "pass back as after"},
            "sample": {"type": "array", "items": {"type": "object"}},
            "created": {"type": "array", "items": {"type": "object"}},
            "existing": {"type": "array", "items": {"type": "object"}},
            "refused": {"type": "array", "items": {"type": "object"}},
            "version": {"type": "integer"},
        },
    },
    "WorkflowResume": {
        "type": "object",
        "required": ["onto"],
        "additionalProperties": False,
        "properties": {
            "onto": {
                "oneOf": [
                    {"const": "latest"},
                    {"type": "integer", "minimum": 1, "maximum": model.MAX_VERSION},
                ],
                "description": "re-pin the never-started executions onto this version first "
                "(it must exist: 422 otherwise)",
            }
        },
    },
    "WorkflowPause": {
        "type": "object",
        "required": ["workflow", "paused", "changed"],
        "properties": {
            "workflow": {"type": "string"},
            "paused": {"type": "boolean"},
            "changed": {"type": "boolean", "description": "false: it already was"},
            "held": {"type": "integer", "description": "live executions paused at once"},
            "resumed": {"type": "integer", "description": "paused executions resumed"},
            "started": {"type": "integer", "description": "queued executions given a slot"},
            "onto": {"type": "integer", "description": "the version re-pinned onto (onto)"},
            "repinned": {
                "type": "integer",
                "description": "never-started executions moved onto that version (onto)",
            },
            "kept": {
                "type": "integer",
                "description": "never-started executions left on their version: their "
                "concurrency key would change (onto)",
            },
        },
    },
    "WebhookSecret": {
        "type": "object",
        "required": ["id", "created_at"],
        "properties": {
            "id": {"type": "integer"},
            "secret": {
                "type": "string",
                "pattern": "^whsec_",
                "description": "Only in the answer that created it, and only for a secret "
                "FlowForge made (not for a supplied value)",
            },
            "created_at": {"type": "string", "format": "date-time"},
            "revoked_at": {"type": ["string", "null"], "format": "date-time"},
            "warning": {
                "type": "string",
                "description": "Only when created for a workflow whose newest version has "
                "auth none, which checks no signature",
            },
        },
    },
    "Accepted": {
        "type": "object",
        "required": ["execution_id", "status"],
        "properties": {
            "execution_id": {
                "type": "string",
                "format": "uuid",
                "description": "the execution started, or (status grouped) the one the event "
                "was recorded against: it exists once its group is due",
            },
            "status": {"type": "string", "enum": [*STATUSES, "grouped"]},
            "group": _ref("IntakeGroup"),
        },
    },
    "IntakeGroup": {
        "type": "object",
        "description": "a debounce or batch group of webhooks and its one execution",
        "properties": {
            "id": {"type": "integer"},
            "workflow": {"type": "string"},
            "kind": {"type": "string", "enum": ["debounce", "batch"]},
            "key": {"type": "string", "description": "the rendered key; '' without one"},
            "status": {
                "type": "string",
                "enum": ["open", "closed", "started", "failed"],
                "description": "open: takes events; closed: a full batch, due; started: "
                "its execution exists; failed: the workflow was archived first",
            },
            "execution_id": {"type": "string", "format": "uuid"},
            "events": {"type": "integer", "description": "events recorded against it"},
            "opened_at": {"type": "string", "format": "date-time"},
            "last_at": {"type": "string", "format": "date-time"},
            "due_at": {"type": "string", "format": "date-time"},
            "deadline_at": {"type": "string", "format": "date-time"},
            "started_at": {"type": ["string", "null"], "format": "date-time"},
            "reason": {"type": ["string", "null"]},
            "event_list": {
                "type": "array",
                "description": "its first 100 events (one group's or an execution's view)",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "received_at": {"type": "string", "format": "date-time"},
                        "idempotency_key": {"type": ["string", "null"]},
                        "body": {},
                    },
                },
            },
        },
    },
    "Attempt": {
        "type": "object",
        "properties": {
            "attempt": {"type": "integer"},
            "worker": {"type": ["string", "null"]},
            "started_at": {"type": "string", "format": "date-time"},
            "finished_at": {"type": ["string", "null"], "format": "date-time"},
            "outcome": {
                "type": ["string", "null"],
                "enum": [*OUTCOMES, None],
            },
            "error": {"type": ["string", "null"]},
            "http_status": {"type": ["integer", "null"]},
            "duration_ms": {"type": ["integer", "null"]},
            "request": {
                "description": (
                    "What this attempt sent, as rendered, recorded before it left; secrets "
                    "and resume tokens redacted, body cut at 4 KiB. Null for pure steps."
                ),
                "oneOf": [_ref("AttemptRequest"), {"type": "null"}],
            },
            "response": {
                "description": (
                    "What came back to this attempt, redacted, body cut at 4 KiB; null when "
                    "no answer came (an unknown attempt) or for pure steps."
                ),
                "oneOf": [_ref("AttemptResponse"), {"type": "null"}],
            },
        },
    },
    "AttemptRequest": {
        "type": "object",
        "properties": {
            "method": {"type": "string"},
            "url": {"type": "string"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": ["string", "null"]},
            "truncated": {"type": "boolean"},
        },
    },
    "AttemptResponse": {
        "type": "object",
        "properties": {
            "status": {"type": "integer"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": "string"},
            "truncated": {"type": "boolean"},
        },
    },
    "ExecutionStep": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "type": {"type": "string"},
            "status": {"type": "string", "enum": STEP_STATUSES},
            "attempt_count": {"type": "integer"},
            "wake_at": {"type": ["string", "null"], "format": "date-time"},
            "output": {},
            "error": {"type": ["string", "null"]},
            "skipped_because": {
                "type": ["string", "null"],
                "description": "For a skipped step: the `when` that was false, or that "
                "every step it depends on was skipped",
            },
            "attempts": {"type": "array", "items": _ref("Attempt")},
        },
    },
    "Execution": {
        "type": "object",
        "required": ["id", "workflow", "version", "status"],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "workflow": {"type": "string"},
            "version": {"type": "integer"},
            "status": {"type": "string", "enum": STATUSES},
            "priority": {
                "type": "integer",
                "description": "fixed when the execution was created",
            },
            "input": {},
            "steps": {"type": "array", "items": _ref("ExecutionStep")},
            "events": {"type": "array", "items": {"type": "object"}},
            "replay_of": {"type": ["string", "null"], "format": "uuid"},
            "replay_from": {"type": ["string", "null"]},
            "replay_of_deleted": {
                "type": "boolean",
                "description": "the original of this replay was deleted by retention",
            },
            "replayed_by": {"type": "array", "items": {"type": "string", "format": "uuid"}},
            "parent": {
                "description": "the execution and workflow step that started this one as its "
                "child; null for any other execution",
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {
                            "execution_id": {"type": "string", "format": "uuid"},
                            "step_id": {"type": "string"},
                        },
                    },
                    {"type": "null"},
                ],
            },
            "parent_deleted": {
                "type": "boolean",
                "description": "the parent of this child was deleted by retention (the "
                "`parent` link stays as recorded)",
            },
            "depth": {
                "type": "integer",
                "description": "how many parents it has (0: not a child)",
            },
            "children": {
                "type": "array",
                "description": "the child executions its workflow steps started, oldest first",
                "items": {
                    "type": "object",
                    "properties": {
                        "execution_id": {"type": "string", "format": "uuid"},
                        "step_id": {"type": "string"},
                        "workflow": {"type": "string"},
                        "status": {"type": "string", "enum": STATUSES},
                        "created_at": {"type": "string", "format": "date-time"},
                        "waiting_for_slot": {
                            "type": "boolean",
                            "description": "queued for a concurrency slot of its workflow",
                        },
                    },
                },
            },
            "waiting_on_children": {
                "type": "array",
                "description": "why it is waiting: the children its waiting "
                "workflow steps wait for; needs_attention says one waits for an operator, "
                "waiting_for_slot that one waits for a concurrency slot",
                "items": {"type": "object"},
            },
            "built_from": {
                "description": "the debounce or batch group it was started from, with its "
                "events; null for any other execution",
                "oneOf": [_ref("IntakeGroup"), {"type": "null"}],
            },
        },
    },
    "ExecutionPage": {
        "type": "object",
        "required": ["items", "next_cursor"],
        "properties": {
            "items": {"type": "array", "items": {"type": "object"}},
            "next_cursor": {"type": ["string", "null"]},
        },
    },
    "MapItems": {
        "type": "object",
        "description": "a map step's items; also each map step's `items` in an execution's page",
        "required": ["total", "counts", "items", "next_after"],
        "properties": {
            "total": {"type": "integer"},
            "counts": {
                "type": "object",
                "properties": {status: {"type": "integer"} for status in ITEM_STATUSES},
            },
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "status", "steps"],
                    "properties": {
                        "index": {"type": "integer"},
                        "status": {"type": "string", "enum": ITEM_STATUSES},
                        "steps": {"type": "array", "items": {"type": "object"}},
                    },
                },
            },
            "next_after": {"type": ["integer", "null"]},
        },
    },
    "ActionResult": {
        "type": "object",
        "required": ["execution_id", "status"],
        "properties": {
            "execution_id": {"type": "string", "format": "uuid"},
            "status": {"type": "string", "enum": STATUSES},
        },
    },
    "Resumed": {
        "type": "object",
        "required": ["execution_id", "step", "status"],
        "properties": {
            "execution_id": {"type": "string", "format": "uuid"},
            "step": {"type": "string"},
            "status": {
                "type": "string",
                "enum": ["resumed", "kept"],
                "description": "kept: the wait had not begun; it takes this body when it does",
            },
        },
    },
}

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

PATHS: dict[str, Any] = {
    "/hooks/{key}": {
        "post": _operation(
            "Start an execution of the workflow's newest version; for a source's name, one "
            "per matching subscription (202 lists them as executions[]); for a workflow with "
            "trigger.webhook.debounce or .batch, record the event in its group (202 status "
            "grouped, with the group and the execution it was recorded against; Location "
            "names the group)",
            {
                "202": {
                    **_json(_ref("Accepted"), "Accepted durably; Location names the execution"),
                    "headers": {
                        "Location": {"schema": {"type": "string"}},
                        "Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]}},
                    },
                },
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "challenge": {"type": "string"},
                            "ping": {"type": "string", "enum": ["ok"]},
                        },
                    },
                    "a signed handshake answered, nothing started: auth slack's "
                    "url_verification (its challenge), auth github's ping",
                ),
                **_problems(400, 401, 404, 409, 413, 415, 422, 503),
            },
            tags=["webhooks"],
            parameters=[WORKFLOW_KEY, *WEBHOOK_HEADERS],
            body={"description": "any JSON value: the execution's input"},
            public=True,
        )
    },
    "/hooks/resume/{token}": {
        "post": _operation(
            "Resume a waiting wait step with the JSON body as its output",
            {
                "202": _json(_ref("Resumed"), "Resumed, or kept until the wait begins"),
                "200": {
                    **_json(_ref("Resumed"), "The same body again: nothing changed"),
                    "headers": {
                        "Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]}}
                    },
                },
                **_problems(400, 401, 404, 409, 410, 413, 415, 503),
            },
            tags=["webhooks"],
            parameters=[
                _path_param("token", {"type": "string"}, "The token of a resume URL"),
                *WEBHOOK_HEADERS,
            ],
            body={"description": "any JSON value: the wait step's output"},
            public=True,
        )
    },
    "/api/v1/workflows": {
        "get": _operation(
            "Workflows the API key may see, each with its newest version",
            {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {"items": {"type": "array", "items": {"type": "object"}}},
                    },
                    "The workflows",
                ),
                **_problems(*AUTHENTICATED),
            },
            tags=["workflows"],
        )
    },
    "/api/v1/workflows/{key}": {
        "get": _operation(
            "One workflow and its versions",
            {"200": _json(_ref("Workflow"), "The workflow"), **_problems(403, 404, *AUTHENTICATED)},
            tags=["workflows"],
            parameters=[WORKFLOW_KEY],
        )
    },
    "/api/v1/workflows/{key}/versions": {
        "post": _operation(
            "Publish the next immutable version (409 when the key is a source's name)",
            {
                "201": _json(_ref("Published"), "Published"),
                **_problems(400, 403, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[WORKFLOW_KEY],
            body=_ref("Definition"),
        )
    },
    "/api/v1/workflows/{key}/versions/{version}": {
        "get": _operation(
            "One immutable version, with its definition",
            {
                "200": _json({"type": "object"}, "The version"),
                **_problems(403, 404, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[
                WORKFLOW_KEY,
                _path_param("version", {"type": "integer", "minimum": 1}, "Version number"),
            ],
        )
    },
    "/api/v1/workflows/{key}/webhook-secrets": {
        "post": _operation(
            "Create a signing secret (shown once; at most two active), or store a "
            'provider\'s secret sent as {"value": "..."}',
            {
                "201": _json(_ref("WebhookSecret"), "Created; the secret is in this answer only"),
                **_problems(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["webhook secrets"],
            parameters=[WORKFLOW_KEY],
        )
        | {
            "requestBody": {
                "required": False,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["value"],
                            "additionalProperties": False,
                            "properties": {
                                "value": {
                                    "type": "string",
                                    "minLength": MIN_SECRET,
                                    "maxLength": MAX_SECRET,
                                    "description": "printable; for a workflow with auth "
                                    "signature (Standard Webhooks) whsec_ and non-empty base64, "
                                    "else 422",
                                }
                            },
                        }
                    }
                },
            }
        },
        "get": _operation(
            "The workflow's signing secrets, without their values",
            {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {"items": {"type": "array", "items": _ref("WebhookSecret")}},
                    },
                    "The secrets",
                ),
                **_problems(403, 404, *AUTHENTICATED),
            },
            tags=["webhook secrets"],
            parameters=[WORKFLOW_KEY],
        ),
    },
    "/api/v1/workflows/{key}/webhook-secrets/{secret_id}": {
        "delete": _operation(
            "Revoke a signing secret",
            {"204": {"description": "Revoked"}, **_problems(403, 404, *AUTHENTICATED)},
            tags=["webhook secrets"],
            parameters=[
                WORKFLOW_KEY,
                _path_param("secret_id", {"type": "integer", "minimum": 1}, "Secret id"),
            ],
        )
    },
    "/api/v1/workflows/{key}/schedule": {
        "get": _operation(
            "The schedule: next 10 fire times (its zone and UTC) and the last 100 ledger rows",
            {"200": _json(_ref("Schedule"), "The schedule"), **_problems(403, 404, *AUTHENTICATED)},
            tags=["schedules"],
            parameters=[WORKFLOW_KEY],
        )
    },
    "/api/v1/workflows/{key}/groups": {
        "get": _operation(
            "The workflow's debounce or batch groups, newest first (at most 100); "
            "?status=open for those still gathering events",
            {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "workflow": {"type": "string"},
                            "items": {"type": "array", "items": _ref("IntakeGroup")},
                        },
                    },
                    "The groups",
                ),
                **_problems(400, 403, 404, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[
                WORKFLOW_KEY,
                {
                    "name": "status",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "enum": ["open", "closed", "started", "failed"]},
                },
            ],
        )
    },
    "/api/v1/workflows/{key}/groups/{group_id}": {
        "get": _operation(
            "One debounce or batch group with its first 100 events",
            {
                "200": _json(_ref("IntakeGroup"), "The group"),
                **_problems(403, 404, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[
                WORKFLOW_KEY,
                _path_param("group_id", {"type": "integer", "minimum": 1}, "Group id"),
            ],
        )
    },
    "/api/v1/workflows/{key}/pause": {
        "post": _operation(
            "Pause the workflow: webhooks are still accepted and queue (max_queued and "
            "start_within_s apply); nothing of it starts or continues until resumed",
            {"200": _json(_ref("WorkflowPause"), "Paused"), **_problems(403, 404, *AUTHENTICATED)},
            tags=["workflows"],
            parameters=[WORKFLOW_KEY],
        )
    },
    "/api/v1/workflows/{key}/reingest": {
        "post": _operation(
            "Re-ingest archived webhooks of a range as new executions of the newest version "
            "(system keys reingest:<delivery id>; at most limit per call, follow next), or "
            "count them with dry_run",
            {
                "200": _json(_ref("ReingestResult"), "The page's result or preview"),
                **_problems(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[WORKFLOW_KEY],
            body=_ref("ReingestRequest"),
        )
    },
    "/api/v1/workflows/{key}/resume": {
        "post": _operation(
            "Resume the workflow: its paused executions in arrival order, then its queues "
            "through flow control. With a body {onto}, its executions that never started a "
            "step are first re-pinned onto that version (409 unless the workflow is paused)",
            {
                "200": _json(_ref("WorkflowPause"), "Resumed"),
                **_problems(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[WORKFLOW_KEY],
        )
        | {
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": _ref("WorkflowResume")}},
            }
        }
    },
    "/api/v1/workflows/{key}/schedule/pause": {
        "post": _operation(
            "Pause: due ticks are ledgered paused and do not fire (idempotent)",
            {"200": _json(_ref("Schedule"), "Paused"), **_problems(403, 404, *AUTHENTICATED)},
            tags=["schedules"],
            parameters=[WORKFLOW_KEY],
        )
    },
    "/api/v1/workflows/{key}/schedule/resume": {
        "post": _operation(
            "Resume: ticks fire again from now on (idempotent)",
            {"200": _json(_ref("Schedule"), "Resumed"), **_problems(403, 404, *AUTHENTICATED)},
            tags=["schedules"],
            parameters=[WORKFLOW_KEY],
        )
    },
    "/api/v1/workflows/{key}/schedule/trigger": {
        "post": _operation(
            "Fire a tick now, under the overlap policy",
            {
                "201": _json(_ref("Tick"), "Fired or buffered: an execution was created"),
                "200": _json(_ref("Tick"), "Skipped by the overlap policy"),
                **_problems(403, 404, 409, *AUTHENTICATED),
            },
            tags=["schedules"],
            parameters=[WORKFLOW_KEY],
        )
    },
    "/api/v1/workflows/{key}/schedule/backfill": {
        "post": _operation(
            "Fire the ticks of a past range that have not fired (at most 1000; dry run lists)",
            {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "dry_run": {"type": "boolean"},
                            "items": {"type": "array", "items": _ref("Tick")},
                        },
                    },
                    "What fired, or would fire",
                ),
                **_problems(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["schedules"],
            parameters=[WORKFLOW_KEY],
            body={
                "type": "object",
                "required": ["from", "to"],
                "additionalProperties": False,
                "description": "to must not be before from (422 otherwise)",
                "properties": {
                    "from": {"type": "string", "format": "date-time"},
                    "to": {"type": "string", "format": "date-time"},
                    "dry_run": {"type": "boolean", "default": False},
                },
            },
        )
    },
    "/api/v1/executions": {
        "get": _operation(
            "Executions, newest first (keyset pagination)",
            {
                "200": _json(_ref("ExecutionPage"), "One page"),
                **_problems(400, 403, *AUTHENTICATED),
            },
            tags=["executions"],
            parameters=[
                {
                    "name": "workflow",
                    "in": "query",
                    "schema": {"type": "string", "pattern": KEY_PATTERN},
                },
                {
                    "name": "status",
                    "in": "query",
                    "schema": {"type": "string", "enum": STATUSES},
                    "description": "needs_attention lists every execution with a step whose "
                    "outcome is unknown, whatever the execution's own status",
                },
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": model.MAX_PAGE,
                        "default": model.DEFAULT_PAGE,
                    },
                },
                {
                    "name": "cursor",
                    "in": "query",
                    "description": "next_cursor from the previous page, passed back as it came "
                    "(empty: the first page)",
                    "schema": {"type": "string", "pattern": CURSOR_PATTERN},
                },
                {
                    "name": "since",
                    "in": "query",
                    "description": "only executions created at or after this instant (ISO 8601)",
                    "schema": {"type": "string", "format": "date-time"},
                },
                {
                    "name": "until",
                    "in": "query",
                    "description": "only executions created before this instant (ISO 8601)",
                    "schema": {"type": "string", "format": "date-time"},
                },
            ],
        )
    },
    "/api/v1/executions/{id}": {
        "get": _operation(
            "The execution with its steps, every attempt and its event history",
            {
                "200": _json(_ref("Execution"), "The execution"),
                **_problems(403, 404, *AUTHENTICATED),
            },
            tags=["executions"],
            parameters=[EXECUTION_ID],
        )
    },
    "/api/v1/circuits": {
        "get": _operation(
            "Outbound limits with an open or half-open circuit or a Retry-After hold in force; "
            "a key scoped to workflows sees only theirs",
            {
                "200": _json({"type": "object", "required": ["circuits"]}, "Open circuits, holds"),
                **_problems(*AUTHENTICATED),
            },
            tags=["circuits"],
        )
    },
    "/api/v1/circuits/{key}/close": {
        "post": _operation(
            "Close a limit's circuit and end its hold by hand; its waiting steps go at once "
            "(a workflow's own limit: a key that may write it; host: and shared: limits: a key "
            "for every workflow)",
            {
                "200": _json({"type": "object", "required": ["key", "state"]}, "Closed"),
                **_problems(403, 404, *AUTHENTICATED),
            },
            tags=["circuits"],
            parameters=[
                _path_param(
                    "key", {"type": "string"}, "The limit's name, or host:NAME / shared:NAME"
                ),
                {
                    "name": "workflow",
                    "in": "query",
                    "schema": {"type": "string", "pattern": KEY_PATTERN},
                    "description": "the workflow whose own limit it is",
                },
            ],
        )
    },
    "/api/v1/executions/{id}/replay": {
        "post": _operation(
            "Replay / fork from a step onto a version: the steps upstream keep their "
            "recorded outputs and are never re-run or re-sent",
            {
                "201": _json(_ref("Replayed"), "The new execution"),
                **_problems(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["executions"],
            parameters=[EXECUTION_ID],
            body=_ref("ReplayRequest"),
        )
    },
    "/api/v1/executions/replay": {
        "post": _operation(
            "Bulk replay by filter: a dry run previews the count and the upto; a call with "
            "that upto replays one batch, oldest first",
            {
                "200": _json(_ref("BulkReplayResult"), "The preview, or one batch"),
                **_problems(400, 403, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["executions"],
            body=_ref("BulkReplayRequest"),
        )
    },
    "/api/v1/executions/{id}/steps/{step}/items": {
        "get": _operation(
            "A page of a map step's items: counts by status, then items in index order",
            {
                "200": _json(_ref("MapItems"), "One page"),
                **_problems(400, 403, 404, *AUTHENTICATED),
            },
            tags=["executions"],
            parameters=[
                EXECUTION_ID,
                _path_param("step", {"type": "string", "pattern": STEP_ID_PATTERN}, "Map step id"),
                {
                    "name": "status",
                    "in": "query",
                    "schema": {"type": "string", "enum": ITEM_STATUSES},
                },
                {
                    "name": "after",
                    "in": "query",
                    "description": "next_after from the previous page",
                    "schema": {
                        "type": "integer",
                        "minimum": -1,
                        "maximum": definitions.MAX_MAP_ITEMS,
                        "default": -1,
                    },
                },
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": model.MAX_PAGE,
                        "default": model.DEFAULT_PAGE,
                    },
                },
            ],
        )
    },
    "/healthz": {
        "get": _operation(
            "Liveness: the process answers",
            {"200": _json({"type": "object"}, "Alive")},
            tags=["operations"],
            public=True,
        )
    },
    "/readyz": {
        "get": _operation(
            "Readiness: the database answers",
            {"200": _json({"type": "object"}, "Ready"), **_problems(503)},
            tags=["operations"],
            public=True,
        )
    },
    "/metrics": {
        "get": _operation(
            "Prometheus metrics",
            {
                "200": {
                    "description": "Prometheus text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **_problems(401, 503),  # 401: FLOWFORGE_METRICS_TOKEN is set, not sent
            },
            tags=["operations"],
            public=True,
        )
    },
    "/api/v1/sources/{name}": {
        "post": _operation(
            "Create or replace a source: one /hooks/{name} routed to several workflows; "
            "a name that is a workflow key is refused (409)",
            {
                "200": _json(_ref("Source"), "Saved; its revision"),
                **_problems(400, 403, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["sources"],
            parameters=[SOURCE_NAME],
            body=_ref("SourceDefinition"),
        ),
        "get": _operation(
            "One source: auth, subscriptions, revision, active secret ids",
            {"200": _json(_ref("Source"), "The source"), **_problems(403, 404, *AUTHENTICATED)},
            tags=["sources"],
            parameters=[SOURCE_NAME],
        ),
    },
    "/api/v1/sources/{name}/webhook-secrets": {
        "post": _operation(
            'Add a signing secret to a source ({"value": ...}, or none to have one made)',
            {
                "201": _json(_ref("WebhookSecret"), "Created"),
                **_problems(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["sources"],
            parameters=[SOURCE_NAME],
        ),
    },
    "/api/v1/sources/{name}/webhook-secrets/{secret_id}": {
        "delete": _operation(
            "Revoke a source's signing secret",
            {"204": {"description": "Revoked"}, **_problems(403, 404, *AUTHENTICATED)},
            tags=["sources"],
            parameters=[
                SOURCE_NAME,
                _path_param("secret_id", {"type": "integer", "minimum": 1}, "Secret id"),
            ],
        )
    },
    "/openapi.json": {
        "get": _operation(
            "This document",
            {"200": _json({"type": "object"}, "OpenAPI 3.1")},
            tags=["operations"],
            public=True,
        )
    },
}

for _declared in ACTIONS:
    PATHS["/api/v1/executions/" + _declared.path("{id}", "{step}")] = _action(_declared)


def _link(path: str, method: str, description: str, **parameters: str) -> dict[str, Any]:
    """An OpenAPI link to the operation at `path`: what a client (and schemathesis's
    stateful phase) may call next with values from this answer."""
    pointer = path.replace("~", "~0").replace("/", "~1")
    return {
        "operationRef": f"#/paths/{pointer}/{method}",
        "description": description,
        "parameters": parameters,
    }


# The actions on a whole execution, by their path's last segment.
_EXECUTION_ACTIONS = tuple(action.route for action in ACTIONS if action.step is None)


def _execution_links(source: str) -> dict[str, Any]:
    """Links from an answer naming an execution (its id at `source`) to reading it and to
    the operator actions on it."""
    links = {"GetExecution": _link("/api/v1/executions/{id}", "get", "Read it", id=source)}
    for action in _EXECUTION_ACTIONS:
        links[f"{action.title()}Execution"] = _link(
            f"/api/v1/executions/{{id}}/{action}", "post", f"{action.title()} it", id=source
        )
    return links


LINKS: dict[tuple[str, str, str], dict[str, Any]] = {
    ("/api/v1/workflows/{key}/versions", "post", "201"): {
        "SendWebhook": _link(
            "/hooks/{key}", "post", "Start an execution", key="$response.body#/workflow"
        ),
        "GetWorkflow": _link(
            "/api/v1/workflows/{key}", "get", "Read the workflow", key="$response.body#/workflow"
        ),
        "GetVersion": _link(
            "/api/v1/workflows/{key}/versions/{version}",
            "get",
            "Read the version",
            key="$response.body#/workflow",
            version="$response.body#/version",
        ),
        "CreateSecret": _link(
            "/api/v1/workflows/{key}/webhook-secrets",
            "post",
            "Give it a signing secret",
            key="$response.body#/workflow",
        ),
        "ListGroups": _link(
            "/api/v1/workflows/{key}/groups", "get", "Its groups", key="$response.body#/workflow"
        ),
    },
    ("/api/v1/workflows", "get", "200"): {
        "SendWebhook": _link(
            "/hooks/{key}",
            "post",
            "Start an execution of the first workflow listed",
            key="$response.body#/items/0/workflow",
        )
    },
    ("/api/v1/executions", "get", "200"): _execution_links("$response.body#/items/0/id"),
    ("/hooks/{key}", "post", "202"): _execution_links("$response.body#/execution_id"),
    ("/api/v1/executions/{id}", "get", "200"): _execution_links("$response.body#/id"),
    ("/api/v1/workflows/{key}/webhook-secrets", "post", "201"): {
        "RevokeSecret": _link(
            "/api/v1/workflows/{key}/webhook-secrets/{secret_id}",
            "delete",
            "Revoke it",
            key="$request.path.key",
            secret_id="$response.body#/id",
        )
    },
    ("/api/v1/sources/{name}", "post", "200"): {
        "GetSource": _link("/api/v1/sources/{name}", "get", "Read it", name="$request.path.name"),
        "CreateSourceSecret": _link(
            "/api/v1/sources/{name}/webhook-secrets",
            "post",
            "Give it a signing secret",
            name="$request.path.name",
        ),
    },
    ("/api/v1/sources/{name}/webhook-secrets", "post", "201"): {
        "RevokeSourceSecret": _link(
            "/api/v1/sources/{name}/webhook-secrets/{secret_id}",
            "delete",
            "Revoke it",
            name="$request.path.name",
            secret_id="$response.body#/id",
        )
    },
}
for (_path, _method, _status), _links in LINKS.items():
    PATHS[_path][_method]["responses"][_status]["links"] = _links


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
        {"type": "array", "items": _ref("JSONValue")},
        {
            "type": "object",
            "propertyNames": {"pattern": STORABLE_TEXT},
            "additionalProperties": _ref("JSONValue"),
        },
    ],
}
# Keywords that only describe: a schema made of these alone is "any JSON".
_ANNOTATIONS = {"description", "default", "title", "examples"}
# Subschemas that say what a value must be (`not` and `if` say the opposite or a condition,
# so the storable rule is not added inside them).
_SUBSCHEMA_LISTS = ("oneOf", "anyOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "then", "else", "contains")


def _storable(schema: Any) -> None:
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
        schema["items"] = _ref("JSONValue")
    if "object" in types and schema.get("additionalProperties", True) is not False:
        schema.setdefault("propertyNames", {"pattern": STORABLE_TEXT})
        if schema.get("additionalProperties", True) is True:
            schema["additionalProperties"] = _ref("JSONValue")
    names = schema.get("propertyNames")
    if isinstance(names, dict) and "pattern" not in names:
        names["pattern"] = STORABLE_TEXT
    for key in _SUBSCHEMA_LISTS:
        for sub in schema.get(key, []):
            _storable(sub)
    for key in _SUBSCHEMA_ONE:
        _storable(schema.get(key))
    for key in ("properties", "dependentSchemas"):
        for sub in schema.get(key, {}).values():
            _storable(sub)


def _storable_paths(paths: dict[str, Any]) -> None:
    """_storable over every parameter, request body and answer of every operation."""
    for item in paths.values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                _storable(parameter["schema"])
            bodies = [operation.get("requestBody", {}), *operation["responses"].values()]
            for body in bodies:
                for media in body.get("content", {}).values():
                    _storable(media.get("schema"))
                for header in body.get("headers", {}).values():
                    _storable(header["schema"])


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


for _path, _item in PATHS.items():
    for _method, _described in _item.items():
        _described["operationId"] = operation_id(_method, _path)
for _schema in SCHEMAS.values():
    _storable(_schema)
SCHEMAS["JSONValue"] = JSON_VALUE
_storable_paths(PATHS)

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "FlowForge",
        "version": "1",
        "description": (
            "Durable webhook-driven workflows. No string anywhere in a request, object "
            "keys included, may hold \\u0000 or an unpaired UTF-16 surrogate (\\ud800 "
            "alone): PostgreSQL cannot store them, so they are answered 400. In a "
            "management request body a whole number written with a fraction (761228.0) "
            "is that integer. Management endpoints need "
            "`Authorization: Bearer <api key>`; webhooks are signed per workflow "
            "(Standard Webhooks) unless the workflow chose auth none."
        ),
    },
    "security": [{"apiKey": []}],
    "paths": PATHS,
    "components": {
        "schemas": SCHEMAS,
        "securitySchemes": {
            "apiKey": {"type": "http", "scheme": "bearer", "description": "ff_... API key"}
        },
    },
}


@bp.get("/openapi.json")
def document() -> Response:
    """The OpenAPI document; public, as it holds nothing secret."""
    return jsonify(DOCUMENT)
