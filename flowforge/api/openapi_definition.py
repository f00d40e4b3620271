"""The definition format in /openapi.json (docs/contract.md#definition): each step type's
object, the Definition and its parts. Every bound and enum is the parser's own
(flowforge/domain/definitions/bounds.py), so the two cannot drift apart."""

from __future__ import annotations

from typing import Any

from flowforge.api.openapi_parts import (
    CONTEXT_PATH_PATTERN,
    KEY_PATTERN,
    STEP_ID_PATTERN,
    WEBHOOK_AUTHS,
    any_case,
    condition,
    ref,
    seconds,
)
from flowforge.domain import definitions


def group_key(description: str) -> dict[str, Any]:
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


def step_schema(
    step_type: str, description: str, required: list[str], **fields: Any
) -> dict[str, Any]:
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
            "when": ref("When"),
            **fields,
        },
    }


WHEN_PATH = {
    "type": "string",
    "pattern": CONTEXT_PATH_PATTERN,
    "description": "a dotted context path, no braces, naming input, an upstream step or "
    "another name in scope (422 otherwise)",
}


# The definition format (docs/contract.md#definition), checked field by field against what
# flowforge/domain/definitions/ accepts by tests/unit/test_openapi_definitions.py: a field,
# a bound or an enum value that one accepts and the other does not fails that test. What a
# schema cannot say (the graph, template scopes, header names, string and nesting limits)
# the API still answers with 422.
STEP_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "http_request": (
        "HttpRequestStep",
        step_schema(
            "http_request",
            "Sends one HTTP request, retried by its policy",
            ["request"],
            request=ref("Request"),
            retry=ref("Retry"),
            budget_s=seconds(definitions.MAX_TIME_LIMIT_S)
            | {"description": "all attempts together; at least one attempt's timeout_s"},
            limit={
                "type": "string",
                "description": "the name of one of the definition's limits",
            },
        ),
    ),
    "delay": (
        "DelayStep",
        step_schema(
            "delay",
            "Waits for a duration or until an instant: exactly one of duration_s and until",
            [],
            duration_s=seconds(definitions.MAX_DELAY_S, zero=True),
            until={"type": "string", "description": "ISO-8601 instant with a zone, or a template"},
        )
        | {"oneOf": [{"required": ["duration_s"]}, {"required": ["until"]}]},
    ),
    "transform": (
        "TransformStep",
        step_schema(
            "transform",
            "Computes its output from templates",
            ["output"],
            output={"description": "any JSON; templates resolved inside strings"},
        ),
    ),
    "wait": (
        "WaitStep",
        step_schema(
            "wait",
            "Waits for a resume (POST to its resume URL) or its timeout",
            ["timeout_s"],
            timeout_s=seconds(definitions.MAX_WAIT_S),
            on_timeout={"type": "string", "enum": list(definitions.ON_TIMEOUT), "default": "fail"},
            auth={
                "type": "string",
                "enum": list(definitions.RESUME_AUTH),
                "default": "token",
                "description": "whether a resume must also be signed",
            },
            form=ref("ApprovalForm"),
            assignees={
                "type": "array",
                "maxItems": definitions.MAX_ASSIGNEES,
                "uniqueItems": True,
                "items": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": definitions.MAX_NAME_CHARS,
                },
                "description": "API key names who may decide the form; none: any operator",
            },
            event={
                "type": "string",
                "pattern": definitions.EVENT_NAME_PATTERN,
                "description": "also end on the next event of this name whose key is `key` "
                "(POST /api/v1/events, or a workflow's emits with `from`); its payload is "
                "the step's output",
            },
            key={
                "type": "string",
                "minLength": 1,
                "maxLength": definitions.MAX_TEMPLATE_CHARS,
                "description": "the event's key, a template rendered when the wait opens "
                "(to at most 200 characters); required with event",
            },
            **{
                "from": {
                    "type": "string",
                    "pattern": KEY_PATTERN,
                    "description": "take only events emitted by this workflow's verified "
                    "deliveries (its emits); absent: events sent through the API",
                }
            },
            lookback_s={
                "type": "number",
                "minimum": 0,
                "maximum": definitions.MAX_EVENT_LOOKBACK_S,
                "description": "take an event received at most this long before the wait "
                "opened (default and cap: FLOWFORGE_EVENT_LOOKBACK_S)",
            },
        )
        | {"dependentRequired": {"event": ["key"], "key": ["event"], "from": ["event"]}},
    ),
    "map": (
        "MapStep",
        step_schema(
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
                "items": ref("ItemStep"),
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
        step_schema(
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
        "oneOf": [ref(STEP_SCHEMAS[step_type][0]) for step_type in definitions.ITEM_STEP_TYPES],
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
                "pattern": any_case(definitions.METHODS),
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
    "ApprovalForm": {
        "type": "object",
        "description": "a wait step's form (docs/contract.md#approvals): a JSON Schema subset",
        "required": ["title", "fields"],
        "additionalProperties": False,
        "properties": {
            "title": {"type": "string", "minLength": 1, "maxLength": definitions.MAX_NAME_CHARS},
            "description": {"type": "string"},
            "fields": {
                "type": "object",
                "required": ["properties"],
                "additionalProperties": False,
                "properties": {
                    "type": {"const": "object"},
                    "properties": {
                        "type": "object",
                        "minProperties": 1,
                        "maxProperties": definitions.MAX_FORM_FIELDS,
                        "propertyNames": {"pattern": STEP_ID_PATTERN},
                        "additionalProperties": ref("FormField"),
                    },
                    "required": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
    "FormField": {
        "type": "object",
        "required": ["type"],
        "additionalProperties": False,
        "properties": {
            "type": {"type": "string", "enum": ["string", "number", "integer", "boolean"]},
            "title": {"type": "string", "minLength": 1, "maxLength": definitions.MAX_NAME_CHARS},
            "description": {"type": "string"},
            "maxLength": {"type": "integer", "minimum": 1, "maximum": definitions.MAX_FORM_TEXT},
            "enum": {
                "type": "array",
                "minItems": 1,
                "maxItems": definitions.MAX_FORM_CHOICES,
                "uniqueItems": True,
                "items": {"type": "string"},
            },
            "oneOf": {
                "type": "array",
                "minItems": 1,
                "maxItems": definitions.MAX_FORM_CHOICES,
                "items": {
                    "type": "object",
                    "required": ["const"],
                    "additionalProperties": False,
                    "properties": {
                        "const": {"type": "string"},
                        "title": {"type": "string", "minLength": 1},
                    },
                },
            },
            "minimum": {"type": "number"},
            "maximum": {"type": "number"},
        },
        "description": "string (maxLength; a choice by enum, or oneOf of const and title), "
        "number or integer (minimum, maximum), boolean; a key of another type is refused",
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
    "When": condition(WHEN_PATH),
    "Step": {
        "oneOf": [ref(name) for name, _ in STEP_SCHEMAS.values()],
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
            "key": group_key("one group per value"),
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
            "key": group_key("one batch per value"),
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
                    "window_s": seconds(definitions.MAX_CIRCUIT_S),
                    "cool_down_s": seconds(definitions.MAX_CIRCUIT_S),
                },
            },
            "max_hold_s": seconds(definitions.MAX_HOLD_S, zero=True)
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
                            "debounce": ref("Debounce"),
                            "batch": ref("Batch"),
                        },
                        "not": {"required": ["debounce", "batch"]},
                    },
                    "schedule": ref("ScheduleDefinition"),
                },
            },
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": definitions.MAX_STEPS,
                "items": ref("Step"),
            },
            "concurrency": ref("Concurrency"),
            "deadline_s": seconds(definitions.MAX_TIME_LIMIT_S)
            | {"description": "the whole execution must end within this"},
            "start_within_s": seconds(definitions.MAX_TIME_LIMIT_S)
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
            "attributes": {
                "type": "object",
                "description": "search attributes: each a template over input only "
                "(never secrets), rendered when the execution is created and stored as "
                "text; one that renders missing, null, empty or too long is not stored",
                "maxProperties": definitions.MAX_ATTRIBUTES,
                "propertyNames": {"pattern": f"^{definitions.ATTRIBUTE_NAME}$"},
                "additionalProperties": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": definitions.MAX_TEMPLATE_CHARS,
                    "pattern": r"\{\{\s*input[.\s]",
                },
            },
            "emits": {
                "type": "object",
                "description": "the event each verified delivery emits "
                "(docs/contract.md#events); needs a signed webhook without debounce or batch",
                "required": ["event", "key"],
                "additionalProperties": False,
                "properties": {
                    "event": {"type": "string", "pattern": definitions.EVENT_NAME_PATTERN},
                    "key": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": definitions.MAX_TEMPLATE_CHARS,
                        "description": "a template over the delivery ({{ input.… }})",
                    },
                },
            },
            "limits": {
                "type": "object",
                "description": "named outbound limits; a name with "
                "{{ input.x }} keys one limit per value",
                "maxProperties": definitions.MAX_LIMITS,
                "propertyNames": {"minLength": 1, "not": {"pattern": "^host:"}},
                "additionalProperties": {"oneOf": [ref("Limit"), ref("SharedLimit")]},
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
