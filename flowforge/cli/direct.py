"""The operator commands straight on PostgreSQL, for the `flowforge` CLI on the box
(`--db`): the same operations as flowforge.cli.apiclient.ApiClient, with the same names and
the same answers as the API, so one CLI handler serves both. The history names
`cli@<host>`.

Only this side has the API keys: the API has no endpoint that makes them.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import psycopg

from flowforge.domain.definitions import parse_until
from flowforge.domain.model import ExecutionQuery
from flowforge.domain.operations import Action, Answer
from flowforge.errors import NotFound
from flowforge.store import apikeys, catalog, failures, notifications, outbound, schedules, timeline
from flowforge.store import events as event_store
from flowforge.store.config import Settings
from flowforge.trust import signatures
from flowforge.usecases import (
    actions,
    events,
    grouping,
    pausing,
    publishing,
    reingest,
    replay,
    ticks,
)


def _cli_actor() -> dict[str, str]:
    """Who acts, for the history, when an operator uses the CLI on the box."""
    return {"kind": "cli", "name": f"cli@{socket.gethostname()}"}


class Database:
    """The operations of ApiClient, straight on PostgreSQL, answering as the API does."""

    remote = False

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def list_executions(self, query: ExecutionQuery) -> dict[str, Any]:
        """A page of executions, newest first (on the box every workflow is in scope)."""
        return timeline.list_executions(self.conn, query)

    def execution(self, execution_id: str) -> dict[str, Any]:
        """One execution with its steps, attempts, history and flow-control state."""
        return timeline.execution_detail(self.conn, execution_id)

    def act(self, action: Action, execution_id: str, values: Sequence[Any]) -> dict[str, Any]:
        """A declared action (flowforge/domain/operations.py), answered as the API does; a
        cancel says `already_finished`."""
        done = actions.perform(self.conn, action, execution_id, values, actor=_cli_actor())
        if action.answer is Answer.CANCEL:
            return {**done.body(), "already_finished": done.already_finished}
        return done.body()

    def replay(self, execution_id: str, from_step: str, version: int | None) -> dict[str, Any]:
        """Replay / fork from a step onto a version (None: the newest)."""
        made = replay.replay(self.conn, execution_id, from_step, version, actor=_cli_actor())
        return made.view()

    def replay_bulk(self, body: dict[str, Any]) -> dict[str, Any]:
        """Bulk replay: a dry run (preview) or one confirmed batch (the API's body)."""
        raw = body["filter"]
        flt = replay.Filter(
            workflow=raw["workflow"],
            version=raw.get("version"),
            status=raw.get("status"),
            since=parse_until(raw["from"]) if raw.get("from") else None,
            until=parse_until(raw["to"]) if raw.get("to") else None,
            error=raw.get("error"),
        )
        version = None if body["version"] == "latest" else int(body["version"])
        if body.get("dry_run"):
            return {"dry_run": True, **replay.preview(self.conn, flt)}
        done = replay.replay_batch(
            self.conn,
            flt,
            body["from_step"],
            version,
            upto=body["upto"],
            after=body.get("after"),
            limit=body.get("limit", 100),
            actor=_cli_actor(),
        )
        return {"dry_run": False, **done}

    def pause_workflow(self, key: str) -> dict[str, Any]:
        """Pause a workflow: webhooks queue, nothing starts or continues."""
        return {"workflow": key, **pausing.pause_workflow(self.conn, key, actor=_cli_actor())}

    def reingest(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        """Re-ingest archived webhooks of a range (one capped page), or count them."""
        return reingest.reingest(self.conn, key, reingest.parse(body), _cli_actor())

    def resume_workflow(self, key: str, onto: pausing.Onto | None = None) -> dict[str, Any]:
        """Resume a workflow: its paused executions in arrival order, then its queues;
        `onto` ("latest" or a number) re-pins its never-started executions first."""
        resumed = pausing.resume_workflow(self.conn, key, actor=_cli_actor(), onto=onto)
        return {"workflow": key, **resumed}

    def circuits(self) -> list[dict[str, Any]]:
        """Limits whose circuit is open or half-open or that a Retry-After holds
        (docs/contract.md#circuits)."""
        return outbound.open_or_held(self.conn)

    def close_circuit(self, key: str, workflow: str | None = None) -> dict[str, Any]:
        """Close a limit's circuit and end its hold by hand."""
        found = outbound.find_key(self.conn, key, workflow)
        if found is None or not outbound.clear(self.conn, found):
            raise NotFound(f"no open circuit or hold has key {key!r}")
        return {"key": key, "workflow": workflow, "state": "closed", "held_until": None}

    def failure_groups(self, workflow: str | None, status: str | None) -> list[dict[str, Any]]:
        """Failure groups, newest first (docs/contract.md#failure-groups)."""
        return failures.list_groups(self.conn, workflow=workflow, status=status)

    def failure_group(self, group_id: int) -> dict[str, Any]:
        """One failure group and its newest executions."""
        return failures.get(self.conn, group_id)

    def failure_group_status(self, group_id: int, verb: str) -> dict[str, Any]:
        """Resolve, ignore or reopen a group."""
        return failures.set_status(self.conn, group_id, verb, actor=_cli_actor())

    def failure_group_act(self, group_id: int, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replay or retry one batch of a group's failed executions (the API's body)."""
        batch = {"after": body.get("after"), "limit": body.get("limit", 100)}
        if verb == "retry":
            return replay.retry_group(self.conn, group_id, actor=_cli_actor(), **batch)
        version = body.get("version", "latest")
        return replay.replay_group(
            self.conn,
            group_id,
            from_step=body.get("from_step"),
            version=None if version == "latest" else int(version),
            actor=_cli_actor(),
            **batch,
        )

    def send_event(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send an event as a key for every workflow does (docs/contract.md#events)."""
        return events.send_checked(self.conn, events.check_event(body), None)

    def events(self, name: str | None, key: str | None, limit: int) -> list[dict[str, Any]]:
        """The events kept, newest first."""
        return event_store.listed(self.conn, name, key, None, limit)

    def notifications(self) -> list[dict[str, Any]]:
        """Every notification endpoint (docs/contract.md#notifications)."""
        return notifications.list_endpoints(self.conn)

    def notification(self, name: str) -> dict[str, Any]:
        """One endpoint and its delivery history."""
        return notifications.get(self.conn, name, deliveries=notifications.HISTORY)

    def subscribe(self, body: dict[str, Any]) -> dict[str, Any]:
        """A new endpoint, its signing secret in this answer only."""
        key = Settings.from_env().notify_key
        return notifications.create(self.conn, workflow=body.pop("workflow", None), key=key, **body)

    def rotate_notification(self, name: str, url: str | None) -> dict[str, Any]:
        """A new signing secret (in this answer only), or a Slack endpoint's new URL."""
        return notifications.rotate(self.conn, name, Settings.from_env().notify_key, url)

    def switch_notification(self, name: str, verb: str) -> dict[str, Any]:
        """Enable or disable an endpoint."""
        switch = notifications.enable if verb == "enable" else notifications.disable
        return switch(self.conn, name)

    def unsubscribe(self, name: str) -> None:
        """Remove an endpoint."""
        notifications.delete(self.conn, name)

    def workflows(self) -> list[dict[str, Any]]:
        """Every workflow."""
        return catalog.list_workflows(self.conn, None)

    def workflow(self, key: str) -> dict[str, Any]:
        """One workflow with its versions."""
        return catalog.get_workflow(self.conn, key)

    def version(self, key: str, number: int) -> dict[str, Any]:
        """One version with its definition."""
        return catalog.get_version(self.conn, key, number)

    def groups(self, key: str, status: str | None) -> dict[str, Any]:
        """The workflow's debounce or batch groups (docs/contract.md#debounce-batch), newest
        first."""
        catalog.get_workflow(self.conn, key)  # NotFound for an unknown workflow
        return {"workflow": key, "items": grouping.groups(self.conn, key, status)}

    def publish(self, key: str, document: Any) -> dict[str, Any]:
        """Validate and publish, checking secret bindings as the API does."""
        definition = catalog.publishable(key, document, Settings.from_env().secret_bindings)
        return publishing.publish(self.conn, key, document, definition, None)

    def check_draft(self, key: str, document: Any) -> dict[str, Any]:
        """The publish checks (secret bindings included) with nothing published."""
        catalog.publishable(key, document, Settings.from_env().secret_bindings)
        return {"workflow": key, "valid": True}

    def create_secret(self, key: str) -> dict[str, Any]:
        """A new signing secret, with the API's warning when nothing checks it."""
        encryption_key = Settings.from_env().encryption_key
        created = catalog.create_secret(self.conn, key, signatures.new_secret(), encryption_key)
        if warning := catalog.unsigned_warning(self.conn, key):
            created = {**created, "warning": warning}
        return created

    def secrets(self, key: str) -> list[dict[str, Any]]:
        """The workflow's signing secrets, without values."""
        return catalog.list_secrets(self.conn, key)

    def revoke_secret(self, key: str, secret_id: int) -> None:
        """Revoke one signing secret."""
        catalog.revoke_secret(self.conn, key, secret_id)

    def create_key(
        self,
        name: str,
        workflows: list[str] | None,
        read_only: bool,
        publish_secrets: bool,
        role: str | None = None,
    ) -> dict[str, Any]:
        """A new API key with its role (docs/contract.md#roles); the plain key is in this
        answer only."""
        chosen = apikeys.role_of(role, read_only, publish_secrets)
        key_id, key = apikeys.create(
            self.conn, name, workflows, publish_secrets=publish_secrets, role=chosen
        )
        return {"id": key_id, "name": name, "role": chosen.value, "key": key}

    def keys(self) -> list[dict[str, Any]]:
        """Every API key, revoked ones included, without secrets."""
        return apikeys.list_keys(self.conn)

    def revoke_key(self, key_id: int) -> None:
        """Revoke an API key (from its next request on)."""
        apikeys.revoke(self.conn, key_id)

    def schedule(self, key: str) -> dict[str, Any]:
        """The schedule: next fire times and the recent ledger."""
        return schedules.show(self.conn, key)

    def pause_schedule(self, key: str) -> dict[str, Any]:
        """Pause the schedule; answers the schedule."""
        return schedules.set_paused(self.conn, key, True, _cli_actor())

    def resume_schedule(self, key: str) -> dict[str, Any]:
        """Resume the schedule; answers the schedule."""
        return schedules.set_paused(self.conn, key, False, _cli_actor())

    def trigger_schedule(self, key: str) -> dict[str, Any]:
        """Fire a tick now; answers what became of it."""
        return ticks.Ticker().trigger(self.conn, key, _cli_actor()).view()

    def backfill_schedule(self, key: str, start: str, end: str, dry_run: bool) -> dict[str, Any]:
        """Fire (or, dry, list) the ticks of a past range that have not fired."""
        try:
            first, last = parse_until(start), parse_until(end)
        except ValueError as exc:
            raise schedules.BackfillInvalid(str(exc)) from None
        if last < first:
            raise schedules.BackfillInvalid("to must not be before from")
        items = ticks.Ticker().backfill(
            self.conn, key, first, last, dry_run=dry_run, actor=_cli_actor()
        )
        return {"dry_run": dry_run, "items": items}
