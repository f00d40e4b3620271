"""The components of /openapi.json besides the problem (flowforge/api/openapi_parts.py) and
the definition format (flowforge/api/openapi_definition.py): sources, workflows, executions,
steps, schedules and the answers of every route."""

from __future__ import annotations

from typing import Any

from flowforge.api.openapi_parts import (
    ATTRIBUTE_VALUES,
    ITEM_STATUSES,
    KEY_PATTERN,
    OUTCOMES,
    STATUSES,
    STEP_ID_PATTERN,
    STEP_STATUSES,
    WEBHOOK_AUTHS,
    ref,
)
from flowforge.domain import model
from flowforge.domain.roles import Role

COMPONENTS: dict[str, Any] = {
    "Me": {
        "type": "object",
        "required": ["id", "name", "role", "workflows", "publish_secrets"],
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "role": {"type": "string", "enum": [role.value for role in Role]},
            "workflows": {"type": ["array", "null"], "items": {"type": "string"}},
            "publish_secrets": {"type": "boolean"},
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
            "schedule": ref("ScheduleDefinition"),
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
            "ledger": {"type": "array", "items": ref("Tick"), "description": "newest first, 100"},
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
                    "attributes": {
                        **ATTRIBUTE_VALUES,
                        "minProperties": 1,
                        "description": "search attributes an execution must all have "
                        "(422 names a bad one: $.filter.attributes.NAME)",
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
            "group": ref("IntakeGroup"),
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
                "oneOf": [ref("AttemptRequest"), {"type": "null"}],
            },
            "response": {
                "description": (
                    "What came back to this attempt, redacted, body cut at 4 KiB; null when "
                    "no answer came (an unknown attempt) or for pure steps."
                ),
                "oneOf": [ref("AttemptResponse"), {"type": "null"}],
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
            "attempts": {"type": "array", "items": ref("Attempt")},
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
            "attributes": {
                **ATTRIBUTE_VALUES,
                "description": "its search attributes, rendered from the input when it was "
                "created ({} when its version declares none or none rendered)",
            },
            "input": {},
            "steps": {"type": "array", "items": ref("ExecutionStep")},
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
                "oneOf": [ref("IntakeGroup"), {"type": "null"}],
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
