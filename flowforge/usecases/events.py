"""An event correlated by a business key (docs/contract.md#events): recorded once by its
identity, then offered to every wait step open for its name and key, each taking it in
its own unit of work (the event's payload as the step's output, the consumption row and
the wake-ups of what became ready in one transaction, under the execution's row lock).

Sent by `POST /api/v1/events` (sender "api", for the sending key's scope) and emitted by
a workflow's verified webhook delivery when its definition declares `emits` (sender
"workflow:<key>", for every workflow whose wait names it in `from`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from flowforge.domain.definitions import Definition
from flowforge.domain.definitions.bounds import EVENT_NAME_PATTERN, MAX_EVENT_KEY_CHARS
from flowforge.domain.model import StepType
from flowforge.domain.templating import TemplateError, render
from flowforge.errors import Conflict, InvalidBody
from flowforge.store import events
from flowforge.store.runs import load_run, save_run, unit_of_work

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sent:
    """The answer to an event: its id, whether it was a redelivery, and how many waiting
    steps took it now."""

    event_id: str
    replayed: bool
    delivered: int


_NAME = re.compile(EVENT_NAME_PATTERN)
# A key or an id: no control characters (bounds.EVENT_TEXT_PATTERN, in /openapi.json).
_CONTROL = re.compile("[\\x00-\\x1f\\x7f]")
MAX_DELIVERY_ID_CHARS = 200
_FIELDS = frozenset({"name", "key", "payload", "id"})


def is_name(value: Any) -> bool:
    """An event name: lowercase letters, digits and `.`, `_`, `:`, `-`."""
    return isinstance(value, str) and _NAME.match(value) is not None


def is_text(value: Any, limit: int) -> bool:
    """1 to `limit` characters, none of them a control character."""
    return isinstance(value, str) and 0 < len(value) <= limit and not _CONTROL.search(value)


def check_event(doc: Any) -> tuple[str, str, Any, str | None]:
    """A sent event's name, key, payload and id (the API's body, the CLI's arguments), or
    InvalidBody naming every field at fault by its JSON path."""
    if not isinstance(doc, dict):
        raise InvalidBody("Invalid event", 'send {"name": ..., "key": ..., "payload": ...}')
    problems = [
        {"path": f"$.{name}", "message": f"unknown field {name!r}"}
        for name in sorted(set(doc) - _FIELDS)
    ]
    if not is_name(doc.get("name")):
        problems.append(
            {
                "path": "$.name",
                "message": "name must be lowercase letters, digits and . _ : - (at most 200)",
            }
        )
    for field, limit in (("key", MAX_EVENT_KEY_CHARS), ("id", MAX_DELIVERY_ID_CHARS)):
        if (field == "key" or field in doc) and not is_text(doc.get(field), limit):
            problems.append(
                {
                    "path": f"$.{field}",
                    "message": f"{field} must be 1 to {limit} characters, no control characters",
                }
            )
    if "payload" not in doc:
        problems.append({"path": "$.payload", "message": "payload is required (null allowed)"})
    if problems:
        raise InvalidBody("Invalid event", problems[0]["message"], errors=problems)
    return doc["name"], doc["key"], doc["payload"], doc.get("id")


def send_checked(
    conn: psycopg.Connection,
    event: tuple[str, str, Any, str | None],
    audience: list[str] | None,
) -> dict[str, Any]:
    """Send an event `check_event` accepted, as the API's sender, and answer it: the API
    and the CLI's direct mode send alike and answer the same document. An event without
    an id is a new one each time (a fresh delivery id)."""
    name, key, payload, delivery_id = event
    sent = send(
        conn,
        sender=events.API_SENDER,
        name=name,
        key=key,
        delivery_id=delivery_id or str(uuid.uuid4()),
        payload=payload,
        audience=audience,
    )
    return {
        "id": sent.event_id,
        "name": name,
        "key": key,
        "delivered": sent.delivered,
        "replayed": sent.replayed,
    }


def fingerprint(key: str, payload: Any, audience: list[str] | None) -> bytes:
    """What a redelivery must repeat: the key, the payload and who may take it."""
    canonical = json.dumps([key, payload, audience], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).digest()


def send(
    conn: psycopg.Connection,
    *,
    sender: str,
    name: str,
    key: str,
    delivery_id: str,
    payload: Any,
    audience: list[str] | None,
) -> Sent:
    """Record an event (or find it again by its identity) and offer it to its waits.

    A redelivery of the same event answers the same id and changes nothing, unless the
    first delivery's fan-out was cut short (a crash): then it finishes it. The same
    identity with another key, payload or audience is a conflict."""
    sha = fingerprint(key, payload, audience)
    params = {
        "sender": sender,
        "name": name,
        "key": key,
        "delivery_id": delivery_id,
        "payload": psycopg.types.json.Jsonb(payload),
        "sha": sha,
        "audience": audience,
        "lookback_s": events.lookback_s(),
    }
    match = {"name": name, "key": key, "sender": sender, "audience": audience}
    with conn.transaction():
        conn.execute(events.LOCK_NAME_KEY, params)
        row = conn.execute(events.INSERT_EVENT, params).fetchone()
        found = None if row is not None else conn.execute(events.FIND_EVENT, params).fetchone()
        first = row if found is None else found
        assert first is not None  # inserted, or there since the conflict
        event_id = str(first[0])
        if found is not None and (bytes(found[2]) != sha or found[4]):
            waits = []  # a conflict, or a redelivery with nothing left to do
        else:
            # Under the (name, key) lock: every wait registered so far; one that opens
            # after this commit finds the event itself (store/events.EARLY_EVENT).
            waits = conn.execute(events.MATCHING_WAITS, match).fetchall()
            if not waits:
                conn.execute(events.FANNED_OUT, {"id": event_id})
    if found is not None:
        if bytes(found[2]) != sha:
            raise Conflict(
                f"event {name!r} {delivery_id!r} was already received with another key,"
                " payload or audience"
            )
        if found[4]:
            return Sent(event_id, replayed=True, delivered=0)
    delivered = fan_out(conn, event_id, name, waits, payload) if waits else 0
    logger.info(
        "event received",
        extra={"event": name, "event_id": event_id, "delivered": delivered},
    )
    return Sent(event_id, replayed=found is not None, delivered=delivered)


def fan_out(
    conn: psycopg.Connection,
    event_id: str,
    name: str,
    waits: list[tuple[str, str]],
    payload: Any,
) -> int:
    """Offer the event to the waits registered for it, one unit of work each (in the
    order of their execution ids), then mark it offered; a wait found closed (timed out,
    cancelled, ended otherwise) is forgotten. Returns how many steps took it."""
    delivered = 0
    for execution_id, step_id in waits:
        if _deliver(conn, event_id, payload, execution_id, step_id, name):
            delivered += 1
    conn.execute(events.FANNED_OUT, {"id": event_id})
    return delivered


def _deliver(
    conn: psycopg.Connection,
    event_id: str,
    payload: Any,
    execution_id: str,
    step_id: str,
    name: str,
) -> bool:
    """One waiting step takes the event, if its wait is still open: the step's status is
    read under the execution row lock, so a timeout that got there first wins and the
    event is not consumed (docs/contract.md#events: no lost or double outcome)."""
    ids = {"event_id": event_id, "execution_id": execution_id, "step_id": step_id}
    with unit_of_work(conn):
        run = load_run(conn, execution_id)
        if run is None:
            return False
        step = run.definition.step(step_id) if step_id in run.steps else None
        is_event_wait = (
            step is not None
            and step.type == StepType.WAIT
            and step.event is not None
            and step.event.name == name
        )
        if not is_event_wait or not run.wait_open(step_id):
            conn.execute(events.DROP_WAIT, ids)
            return False
        if conn.execute(events.CONSUMED, ids).fetchone() is not None:
            return False
        run.receive_event(step_id, event_id, payload)
        save_run(conn, run.take_changes())
    return True


def emit(
    conn: psycopg.Connection,
    workflow_key: str,
    definition: Definition,
    execution_id: str,
    body: Any,
) -> Sent | None:
    """The event a workflow's verified delivery emits (its definition's `emits`), its key
    rendered from the delivery; its identity is the delivery's execution, so a redelivery
    of the webhook emits nothing new. None when the key does not render."""
    emits = definition.emits
    assert emits is not None
    try:
        rendered = render(emits.key, {"input": body})
    except TemplateError as exc:
        logger.warning(
            "event not emitted: its key did not render",
            extra={"workflow": workflow_key, "execution_id": execution_id, "reason": str(exc)},
        )
        return None
    if (
        isinstance(rendered, bool)
        or not isinstance(rendered, str | int)
        or not 0 < len(str(rendered)) <= MAX_EVENT_KEY_CHARS
    ):
        logger.warning(
            "event not emitted: its key is not a string of 1 to 200 characters",
            extra={"workflow": workflow_key, "execution_id": execution_id},
        )
        return None
    return send(
        conn,
        sender=events.workflow_sender(workflow_key),
        name=emits.name,
        key=str(rendered),
        delivery_id=execution_id,
        payload=body,
        audience=None,
    )
