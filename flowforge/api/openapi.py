"""GET /openapi.json: a hand-written OpenAPI 3.1 description of the whole HTTP API.

Written by hand rather than generated so that it states the contract (docs/contract.md#http-api)
instead of echoing whatever the code happens to do; tests/integration/test_fuzz_api.py runs
schemathesis against a live bin/api from this document, so a route missing here is a
route nobody fuzzes.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from flowforge.api import (
    approvals_openapi,
    events_openapi,
    failures_openapi,
    notifications_openapi,
)
from flowforge.api.auth import requires
from flowforge.api.bodies import MAX_SECRET, MIN_SECRET
from flowforge.api.openapi_definition import DEFINITION_SCHEMAS, STEP_SCHEMAS
from flowforge.api.openapi_links import LINKS
from flowforge.api.openapi_parts import (
    ATTRIBUTE_FILTER,
    AUTHENTICATED,
    CURSOR_PATTERN,
    EXECUTION_ID,
    ITEM_STATUSES,
    KEY_PATTERN,
    PROBLEM,
    SOURCE_NAME,
    STATUSES,
    STEP_ID_PATTERN,
    STEP_PARAM,
    STEP_ROW_PARAM,
    WEBHOOK_HEADERS,
    WORKFLOW_KEY,
    action_body,
    endpoint,
    json_answer,
    on_one,
    operation_id,
    path_param,
    problem_answers,
    ref,
)
from flowforge.api.openapi_schemas import COMPONENTS
from flowforge.api.openapi_storable import JSON_VALUE, storable, storable_paths
from flowforge.api.openapi_store_bound import STORE_BOUND
from flowforge.domain import definitions, model
from flowforge.domain.operations import ACTIONS, Action, Kind
from flowforge.domain.roles import Access

__all__ = ["DOCUMENT", "PATHS", "STEP_SCHEMAS", "WEBHOOK_HEADERS", "bp", "operation_id"]

bp = Blueprint("openapi", __name__)


# Every component: the problem, the definition format, then the others; an action with a
# body adds its own (_action).
SCHEMAS: dict[str, Any] = {"Problem": PROBLEM, **DEFINITION_SCHEMAS, **STORE_BOUND, **COMPONENTS}


def _action(action: Action) -> dict[str, Any]:
    """A declared operator action (flowforge/domain/operations.py) as its path's item: a
    POST answered with an ActionResult or a refusal; a body with its fields as declared."""
    step = action.step
    parameters = [EXECUTION_ID]
    if step is not None:
        parameters.append(STEP_ROW_PARAM if step.kind is Kind.STEP_ROW else STEP_PARAM)
    if action.body is not None:
        SCHEMAS[action.body] = action_body(action)
    answers = {
        code: json_answer(ref("ActionResult"), text) for code, text in action.answers.items()
    }
    refusals = problem_answers(
        *sorted({403, *action.refusals, *(() if action.body is None else (400, 413, 415, 422))}),
        *AUTHENTICATED,
    )
    return {
        "post": endpoint(
            action.summary,
            {**answers, **refusals},
            tags=["executions"],
            parameters=parameters,
            body=None if action.body is None else ref(action.body),
        )
    }


PATHS: dict[str, Any] = {
    "/hooks/{key}": {
        "post": endpoint(
            "Start an execution of the workflow's newest version; for a source's name, one "
            "per matching subscription (202 lists them as executions[]); for a workflow with "
            "trigger.webhook.debounce or .batch, record the event in its group (202 status "
            "grouped, with the group and the execution it was recorded against; Location "
            "names the group)",
            {
                "202": {
                    **json_answer(
                        ref("Accepted"), "Accepted durably; Location names the execution"
                    ),
                    "headers": {
                        "Location": {"schema": {"type": "string"}},
                        "Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]}},
                    },
                },
                "200": json_answer(
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
                **problem_answers(400, 401, 404, 409, 413, 415, 422, 503),
            },
            tags=["webhooks"],
            parameters=[WORKFLOW_KEY, *WEBHOOK_HEADERS],
            body={"description": "any JSON value: the execution's input"},
            public=True,
        )
    },
    "/hooks/resume/{token}": {
        "post": endpoint(
            "Resume a waiting wait step with the JSON body as its output",
            {
                "202": json_answer(ref("Resumed"), "Resumed, or kept until the wait begins"),
                "200": {
                    **json_answer(ref("Resumed"), "The same body again: nothing changed"),
                    "headers": {
                        "Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]}}
                    },
                },
                **problem_answers(400, 401, 404, 409, 410, 413, 415, 503),
            },
            tags=["webhooks"],
            parameters=[
                path_param("token", {"type": "string"}, "The token of a resume URL"),
                *WEBHOOK_HEADERS,
            ],
            body={"description": "any JSON value: the wait step's output"},
            public=True,
        )
    },
    "/api/v1/workflows": {
        "get": endpoint(
            "Workflows the API key may see, each with its newest version",
            {
                "200": json_answer(
                    {
                        "type": "object",
                        "properties": {"items": {"type": "array", "items": {"type": "object"}}},
                    },
                    "The workflows",
                ),
                **problem_answers(*AUTHENTICATED),
            },
            tags=["workflows"],
        )
    },
    "/api/v1/me": {
        "get": endpoint(
            "The calling API key: its role, workflow scope and secrets grant",
            {
                "200": json_answer(ref("Me"), "The key"),
                **problem_answers(*AUTHENTICATED),
            },
            tags=["keys"],
        )
    },
    "/api/v1/workflows/{key}": {
        "get": on_one(
            "One workflow and its versions",
            json_answer(ref("Workflow"), "The workflow"),
            tags=["workflows"],
            parameter=WORKFLOW_KEY,
        )
    },
    "/api/v1/workflows/{key}/versions": {
        "post": endpoint(
            "Publish the next immutable version (409 when the key is a source's name)",
            {
                "201": json_answer(ref("Published"), "Published"),
                **problem_answers(400, 403, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[WORKFLOW_KEY],
            body=ref("Definition"),
        )
    },
    "/api/v1/workflows/{key}/check": {
        "post": endpoint(
            "Check a draft definition as publishing would, publishing nothing: 200 with its "
            "changes against the newest version and its steps, or the 422 publishing answers",
            {
                "200": json_answer({"type": "object"}, "Valid; what it would change"),
                **problem_answers(400, 403, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[WORKFLOW_KEY],
            body=ref("Definition"),
        )
    },
    "/api/v1/workflows/{key}/versions/{version}": {
        "get": endpoint(
            "One immutable version, with its definition",
            {
                "200": json_answer({"type": "object"}, "The version"),
                **problem_answers(403, 404, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[
                WORKFLOW_KEY,
                path_param("version", {"type": "integer", "minimum": 1}, "Version number"),
            ],
        )
    },
    "/api/v1/workflows/{key}/webhook-secrets": {
        "post": endpoint(
            "Create a signing secret (shown once; at most two active), or store a "
            'provider\'s secret sent as {"value": "..."}',
            {
                "201": json_answer(
                    ref("WebhookSecret"), "Created; the secret is in this answer only"
                ),
                **problem_answers(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
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
        "get": on_one(
            "The workflow's signing secrets, without their values",
            json_answer(
                {
                    "type": "object",
                    "properties": {"items": {"type": "array", "items": ref("WebhookSecret")}},
                },
                "The secrets",
            ),
            tags=["webhook secrets"],
            parameter=WORKFLOW_KEY,
        ),
    },
    "/api/v1/workflows/{key}/webhook-secrets/{secret_id}": {
        "delete": endpoint(
            "Revoke a signing secret",
            {"204": {"description": "Revoked"}, **problem_answers(403, 404, *AUTHENTICATED)},
            tags=["webhook secrets"],
            parameters=[
                WORKFLOW_KEY,
                path_param("secret_id", {"type": "integer", "minimum": 1}, "Secret id"),
            ],
        )
    },
    "/api/v1/workflows/{key}/schedule": {
        "get": on_one(
            "The schedule: next 10 fire times (its zone and UTC) and the last 100 ledger rows",
            json_answer(ref("Schedule"), "The schedule"),
            tags=["schedules"],
            parameter=WORKFLOW_KEY,
        )
    },
    "/api/v1/workflows/{key}/groups": {
        "get": endpoint(
            "The workflow's debounce or batch groups, newest first (at most 100); "
            "?status=open for those still gathering events",
            {
                "200": json_answer(
                    {
                        "type": "object",
                        "properties": {
                            "workflow": {"type": "string"},
                            "items": {"type": "array", "items": ref("IntakeGroup")},
                        },
                    },
                    "The groups",
                ),
                **problem_answers(400, 403, 404, *AUTHENTICATED),
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
        "get": endpoint(
            "One debounce or batch group with its first 100 events",
            {
                "200": json_answer(ref("IntakeGroup"), "The group"),
                **problem_answers(403, 404, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[
                WORKFLOW_KEY,
                path_param("group_id", {"type": "integer", "minimum": 1}, "Group id"),
            ],
        )
    },
    "/api/v1/workflows/{key}/pause": {
        "post": on_one(
            "Pause the workflow: webhooks are still accepted and queue (max_queued and "
            "start_within_s apply); nothing of it starts or continues until resumed",
            json_answer(ref("WorkflowPause"), "Paused"),
            tags=["workflows"],
            parameter=WORKFLOW_KEY,
        )
    },
    "/api/v1/workflows/{key}/reingest": {
        "post": endpoint(
            "Re-ingest archived webhooks of a range as new executions of the newest version "
            "(system keys reingest:<delivery id>; at most limit per call, follow next), or "
            "count them with dry_run",
            {
                "200": json_answer(ref("ReingestResult"), "The page's result or preview"),
                **problem_answers(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[WORKFLOW_KEY],
            body=ref("ReingestRequest"),
        )
    },
    "/api/v1/workflows/{key}/resume": {
        "post": endpoint(
            "Resume the workflow: its paused executions in arrival order, then its queues "
            "through flow control. With a body {onto}, its executions that never started a "
            "step are first re-pinned onto that version (409 unless the workflow is paused)",
            {
                "200": json_answer(ref("WorkflowPause"), "Resumed"),
                **problem_answers(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["workflows"],
            parameters=[WORKFLOW_KEY],
        )
        | {
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": ref("WorkflowResume")}},
            }
        }
    },
    "/api/v1/workflows/{key}/schedule/pause": {
        "post": on_one(
            "Pause: due ticks are ledgered paused and do not fire (idempotent)",
            json_answer(ref("Schedule"), "Paused"),
            tags=["schedules"],
            parameter=WORKFLOW_KEY,
        )
    },
    "/api/v1/workflows/{key}/schedule/resume": {
        "post": on_one(
            "Resume: ticks fire again from now on (idempotent)",
            json_answer(ref("Schedule"), "Resumed"),
            tags=["schedules"],
            parameter=WORKFLOW_KEY,
        )
    },
    "/api/v1/workflows/{key}/schedule/trigger": {
        "post": endpoint(
            "Fire a tick now, under the overlap policy",
            {
                "201": json_answer(ref("Tick"), "Fired or buffered: an execution was created"),
                "200": json_answer(ref("Tick"), "Skipped by the overlap policy"),
                **problem_answers(403, 404, 409, *AUTHENTICATED),
            },
            tags=["schedules"],
            parameters=[WORKFLOW_KEY],
        )
    },
    "/api/v1/workflows/{key}/schedule/backfill": {
        "post": endpoint(
            "Fire the ticks of a past range that have not fired (at most 1000; dry run lists)",
            {
                "200": json_answer(
                    {
                        "type": "object",
                        "properties": {
                            "dry_run": {"type": "boolean"},
                            "items": {"type": "array", "items": ref("Tick")},
                        },
                    },
                    "What fired, or would fire",
                ),
                **problem_answers(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
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
        "get": endpoint(
            "Executions, newest first (keyset pagination)",
            {
                "200": json_answer(ref("ExecutionPage"), "One page"),
                **problem_answers(400, 403, 422, *AUTHENTICATED),
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
                ATTRIBUTE_FILTER,
            ],
        )
    },
    "/api/v1/executions/{id}": {
        "get": on_one(
            "The execution with its steps, every attempt and its event history",
            json_answer(ref("Execution"), "The execution"),
            tags=["executions"],
            parameter=EXECUTION_ID,
        )
    },
    "/api/v1/circuits": {
        "get": endpoint(
            "Outbound limits with an open or half-open circuit or a Retry-After hold in force; "
            "a key scoped to workflows sees only theirs",
            {
                "200": json_answer(
                    {"type": "object", "required": ["circuits"]}, "Open circuits, holds"
                ),
                **problem_answers(*AUTHENTICATED),
            },
            tags=["circuits"],
        )
    },
    "/api/v1/circuits/{key}/close": {
        "post": endpoint(
            "Close a limit's circuit and end its hold by hand; its waiting steps go at once "
            "(a workflow's own limit: a key that may write it; host: and shared: limits: a key "
            "for every workflow)",
            {
                "200": json_answer({"type": "object", "required": ["key", "state"]}, "Closed"),
                **problem_answers(403, 404, *AUTHENTICATED),
            },
            tags=["circuits"],
            parameters=[
                path_param(
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
        "post": endpoint(
            "Replay / fork from a step onto a version: the steps upstream keep their "
            "recorded outputs and are never re-run or re-sent",
            {
                "201": json_answer(ref("Replayed"), "The new execution"),
                **problem_answers(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["executions"],
            parameters=[EXECUTION_ID],
            body=ref("ReplayRequest"),
        )
    },
    "/api/v1/executions/replay": {
        "post": endpoint(
            "Bulk replay by filter: a dry run previews the count and the upto; a call with "
            "that upto replays one batch, oldest first",
            {
                "200": json_answer(ref("BulkReplayResult"), "The preview, or one batch"),
                **problem_answers(400, 403, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["executions"],
            body=ref("BulkReplayRequest"),
        )
    },
    "/api/v1/executions/{id}/steps/{step}/items": {
        "get": endpoint(
            "A page of a map step's items: counts by status, then items in index order",
            {
                "200": json_answer(ref("MapItems"), "One page"),
                **problem_answers(400, 403, 404, *AUTHENTICATED),
            },
            tags=["executions"],
            parameters=[
                EXECUTION_ID,
                path_param("step", {"type": "string", "pattern": STEP_ID_PATTERN}, "Map step id"),
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
        "get": endpoint(
            "Liveness: the process answers",
            {"200": json_answer({"type": "object"}, "Alive")},
            tags=["operations"],
            public=True,
        )
    },
    "/readyz": {
        "get": endpoint(
            "Readiness: the database answers",
            {"200": json_answer({"type": "object"}, "Ready"), **problem_answers(503)},
            tags=["operations"],
            public=True,
        )
    },
    "/metrics": {
        "get": endpoint(
            "Prometheus metrics",
            {
                "200": {
                    "description": "Prometheus text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **problem_answers(401, 503),  # 401: FLOWFORGE_METRICS_TOKEN is set, not sent
            },
            tags=["operations"],
            public=True,
        )
    },
    "/api/v1/sources/{name}": {
        "post": endpoint(
            "Create or replace a source: one /hooks/{name} routed to several workflows; "
            "a name that is a workflow key is refused (409)",
            {
                "200": json_answer(ref("Source"), "Saved; its revision"),
                **problem_answers(400, 403, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["sources"],
            parameters=[SOURCE_NAME],
            body=ref("SourceDefinition"),
        ),
        "get": on_one(
            "One source: auth, subscriptions, revision, active secret ids",
            json_answer(ref("Source"), "The source"),
            tags=["sources"],
            parameter=SOURCE_NAME,
        ),
    },
    "/api/v1/sources/{name}/webhook-secrets": {
        "post": endpoint(
            'Add a signing secret to a source ({"value": ...}, or none to have one made)',
            {
                "201": json_answer(ref("WebhookSecret"), "Created"),
                **problem_answers(400, 403, 404, 409, 413, 415, 422, *AUTHENTICATED),
            },
            tags=["sources"],
            parameters=[SOURCE_NAME],
        ),
    },
    "/api/v1/sources/{name}/webhook-secrets/{secret_id}": {
        "delete": endpoint(
            "Revoke a source's signing secret",
            {"204": {"description": "Revoked"}, **problem_answers(403, 404, *AUTHENTICATED)},
            tags=["sources"],
            parameters=[
                SOURCE_NAME,
                path_param("secret_id", {"type": "integer", "minimum": 1}, "Secret id"),
            ],
        )
    },
    "/openapi.json": {
        "get": endpoint(
            "This document",
            {"200": json_answer({"type": "object"}, "OpenAPI 3.1")},
            tags=["operations"],
            public=True,
        )
    },
}

for _declared in ACTIONS:
    PATHS["/api/v1/executions/" + _declared.path("{id}", "{step}")] = _action(_declared)


for (_path, _method, _status), _links in LINKS.items():
    PATHS[_path][_method]["responses"][_status]["links"] = _links


PATHS.update(notifications_openapi.paths())
PATHS.update(approvals_openapi.paths())
PATHS.update(failures_openapi.paths())
PATHS.update(events_openapi.paths())
for _path, _item in PATHS.items():
    for _method, _described in _item.items():
        _described["operationId"] = operation_id(_method, _path)
for _schema in SCHEMAS.values():
    storable(_schema)
SCHEMAS["JSONValue"] = JSON_VALUE
storable_paths(PATHS)

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
            "(Standard Webhooks) unless the workflow chose auth none. A key's role decides "
            "what it may do: viewer reads, operator also acts on executions, admin also "
            "publishes and manages secrets, sources, notification endpoints and limits; a "
            "route the role may not use answers 403 with required_role."
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
@requires(Access.PUBLIC)
def document() -> Response:
    """The OpenAPI document; public, as it holds nothing secret."""
    return jsonify(DOCUMENT)
