"""The console's operator actions: the one place it calls flowforge.usecases.actions (and the
store's other units of work an operator starts), each call recorded in the execution's
history with the signed-in key as its actor."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from flowforge.domain.definitions import Definition
from flowforge.domain.operations import Action
from flowforge.store import failures, notifications, outbound, schedules
from flowforge.store.apikeys import ApiKey
from flowforge.usecases import actions, approvals, pausing, publishing, ticks
from flowforge.usecases import reingest as reingest_module
from flowforge.usecases import replay as replay_module

# One per process, as the API's schedule endpoints keep: it caches intake targets, which
# the intake statement re-checks.
_TICKER = ticks.Ticker()


def act(
    conn: psycopg.Connection,
    key: ApiKey,
    action: Action,
    execution_id: str,
    values: Sequence[Any],
) -> str:
    """A declared action on an execution (flowforge/domain/operations.py); its status
    after."""
    return actions.perform(conn, action, execution_id, values, actor=key.actor()).status


def decide_approval(
    conn: psycopg.Connection,
    key: ApiKey,
    execution_id: str,
    step_id: str,
    decision: str,
    values: dict[str, Any],
) -> approvals.Decided:
    """Approve or reject an open approval (docs/contract.md#approvals) as the signed-in key."""
    return approvals.decide(conn, execution_id, step_id, key, decision, values)


def failure_group(
    conn: psycopg.Connection, key: ApiKey, group_id: int, action: str
) -> dict[str, Any]:
    """docs/contract.md#failure-groups: resolve, ignore or reopen a group, or replay (from its
    step onto the newest version) or retry one batch of its failed executions; what it did."""
    if action in failures.ACTION_STATUS:
        return failures.set_status(conn, group_id, action, actor=key.actor())
    actor = key.actor()
    if action == "replay":
        return replay_module.replay_group(
            conn, group_id, from_step=None, version=None, after=None, limit=BATCH, actor=actor
        )
    return replay_module.retry_group(conn, group_id, after=None, limit=BATCH, actor=actor)


# What one press of a group's replay or retry button takes (the rest: press again).
BATCH = 100


def pause_workflow(conn: psycopg.Connection, key: ApiKey, workflow: str) -> dict[str, Any]:
    """Pause a workflow: webhooks queue, nothing of it starts or continues."""
    return pausing.pause_workflow(conn, workflow, actor=key.actor())


def resume_workflow(
    conn: psycopg.Connection, key: ApiKey, workflow: str, onto: int | None = None
) -> dict[str, Any]:
    """Resume a workflow: its paused executions in arrival order, then its queues; with
    `onto`, its never-started executions re-pinned onto that version first."""
    return pausing.resume_workflow(conn, workflow, actor=key.actor(), onto=onto)


def replay(
    conn: psycopg.Connection, key: ApiKey, execution_id: str, from_step: str, version: int | None
) -> str:
    """Replay from a step onto a version (None: the newest); returns the new execution."""
    return replay_module.replay(
        conn, execution_id, from_step, version, actor=key.actor()
    ).execution_id


def replay_onto_newest(
    conn: psycopg.Connection, key: ApiKey, execution_id: str, from_step: str
) -> str:
    """Replay a failed execution from its failed step onto the newest version."""
    return replay(conn, key, execution_id, from_step, None)


def pause_schedule(conn: psycopg.Connection, key: ApiKey, workflow: str) -> dict[str, Any]:
    """Pause a schedule: due ticks are ledgered paused, not fired (as the API's pause)."""
    return schedules.set_paused(conn, workflow, True, key.actor())


def resume_schedule(conn: psycopg.Connection, key: ApiKey, workflow: str) -> dict[str, Any]:
    """Resume a schedule: ticks fire again from now on."""
    return schedules.set_paused(conn, workflow, False, key.actor())


def trigger_schedule(conn: psycopg.Connection, key: ApiKey, workflow: str) -> dict[str, Any]:
    """Fire a tick now, under the overlap policy; what became of it."""
    return _TICKER.trigger(conn, workflow, key.actor()).view()


def backfill_schedule(
    conn: psycopg.Connection,
    key: ApiKey,
    workflow: str,
    start: datetime,
    end: datetime,
    *,
    dry_run: bool,
) -> list[dict[str, Any]]:
    """Fire (or, dry, list) the past range's ticks that have not fired, as the API does."""
    return _TICKER.backfill(conn, workflow, start, end, dry_run=dry_run, actor=key.actor())


def reingest(
    conn: psycopg.Connection, key: ApiKey, workflow: str, request: reingest_module.Request
) -> dict[str, Any]:
    """Re-ingest a workflow's archived deliveries as new executions (dry: how many, and a
    sample)."""
    return reingest_module.reingest(conn, workflow, request, key.actor())


def close_circuit(conn: psycopg.Connection, circuit: str, workflow: str | None) -> bool:
    """Close a limit's circuit and end its hold by hand (no actor is recorded: a limit has
    no history); False if neither was in force."""
    found = outbound.find_key(conn, circuit, workflow)
    return found is not None and outbound.clear(conn, found)


def switch_notification(conn: psycopg.Connection, name: str, *, enable: bool) -> None:
    """Enable or disable a notification endpoint (docs/contract.md#notifications)."""
    if enable:
        notifications.enable(conn, name)
    else:
        notifications.disable(conn, name)


def publish(
    conn: psycopg.Connection, key: ApiKey, workflow: str, document: Any, definition: Definition
) -> dict[str, Any]:
    """The editor's draft as the next version, published by the signed-in key."""
    return publishing.publish(conn, workflow, document, definition, key.id)
