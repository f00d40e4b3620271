"""A wait step that also ends on an event correlated by a business key
(docs/contract.md#events): when it opens, its key is rendered from the execution and an
event received within its lookback is taken at once; otherwise it waits, registered
(`Changes.event_waits`) for the event's sender to find it. Either way the event is
consumed (`Changes.consumed_events`) in the unit of work that makes the step succeed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from flowforge.domain.model import EventKind
from flowforge.domain.model import StepStatus as S
from flowforge.domain.templating import TemplateError, render

if TYPE_CHECKING:
    from flowforge.domain.definitions import EventWait, Step
    from flowforge.domain.engine import Run

MAX_KEY_CHARS = 200  # domain/definitions/bounds.MAX_EVENT_KEY_CHARS, which kinds do not import


class EventPort(Protocol):
    """The store's side (store/events.py over the locked transaction): the oldest event a
    wait opening now may take, or None. It serialises with the events' senders per name
    and key, so an event is either found here or finds the registered wait."""

    def early_event(
        self, step_id: str, wait: EventWait, key: str, lookback_s: float | None
    ) -> tuple[str, Any] | None: ...


def event_key(run: Run, step: Step) -> str:
    """The wait's key, rendered from the execution (TemplateError, ValueError)."""
    assert step.event is not None
    rendered = render(step.event.key, run.context(step.id))
    if isinstance(rendered, bool) or not isinstance(rendered, str | int):
        raise ValueError("key must render to a string or an integer")
    key = str(rendered)
    if not key or len(key) > MAX_KEY_CHARS:
        raise ValueError(f"key must render to 1 to {MAX_KEY_CHARS} characters")
    return key


def open_wait(run: Run, step: Step) -> None:
    """Open an event wait: take an event kept from before, or wait for the next one."""
    assert step.event is not None and step.timeout_s is not None
    try:
        key = event_key(run, step)
    except (TemplateError, ValueError) as exc:
        run.fail_step(step.id, f"event key: {exc}")
        return
    port = run.event_port
    found = None if port is None else port.early_event(step.id, step.event, key, None)
    if found is not None:
        event_id, payload = found
        run.changes.consumed_events.append((event_id, step.id))
        run.events.append((step.id, EventKind.WAIT_RESUMED, {"event": event_id, "early": True}))
        run.set_step(
            step.id,
            S.SUCCEEDED,
            output=payload,
            started_at=run.now,
            reason=f"event {step.event.name} {key!r} received before the wait began",
        )
        return
    run.changes.event_waits.append((step.id, step.event.name, key, step.event.sender))
    run.set_step(
        step.id,
        S.WAITING,
        wake_at=run.now + timedelta(seconds=step.timeout_s),
        started_at=run.now,
        reason=f"waiting for event {step.event.name} {key!r} or a resume,"
        f" at most {step.timeout_s:g} s",
    )


def receive(run: Run, step_id: str, event_id: str, payload: Any) -> None:
    """An open event wait takes the event: its payload is the step's output."""
    run.changes.consumed_events.append((event_id, step_id))
    run.events.append((step_id, EventKind.WAIT_RESUMED, {"event": event_id}))
    run.set_step(step_id, S.SUCCEEDED, output=payload, wake_at=None, error=None)
    run.advance()
