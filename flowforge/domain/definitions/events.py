"""Events correlated by a business key (docs/contract.md#events): a wait step's `event`,
`key`, `from` and `lookback_s`, and a workflow's `emits`."""

from __future__ import annotations

import re
from typing import Any

from flowforge.domain.definitions.bounds import (
    EVENT_NAME_PATTERN,
    MAX_EVENT_LOOKBACK_S,
    MAX_TEMPLATE_CHARS,
)
from flowforge.domain.definitions.checker import Checker
from flowforge.domain.definitions.shapes import EVENT_WAIT_KEYS, EventEmit, EventWait
from flowforge.domain.jsonvalues import is_number

_NAME = re.compile(EVENT_NAME_PATTERN)
_EMITS_KEYS = frozenset({"event", "key"})


class EventsSection(Checker):
    """A wait step's event fields and the definition's `emits`."""

    def event_name(self, value: Any, path: str) -> bool:
        """An event name: lowercase letters, digits and `.`, `_`, `:`, `-`."""
        if isinstance(value, str) and _NAME.match(value):
            return True
        self.error(
            path,
            "event must be a name of at most 200 characters: lowercase letters, digits"
            " and . _ : - (such as payment.settled)",
        )
        return False

    def event_key(self, value: Any, path: str, ancestors: frozenset[str]) -> bool:
        """A key: a string, usually a template over the execution (`{{ input.order_id }}`)."""
        if not isinstance(value, str) or not value or len(value) > MAX_TEMPLATE_CHARS:
            self.error(path, "key is required: a non-empty string such as {{ input.order_id }}")
            return False
        self.templates(value, path, ancestors, secrets=False)
        return True

    def event_wait(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> EventWait | None:
        """A wait step that ends on an event as well as a resume; None without `event`."""
        if "event" not in raw:
            for name in sorted(EVENT_WAIT_KEYS & raw.keys()):
                self.error(f"{path}.{name}", f"{name} needs event: the name of the awaited event")
            return None
        ok = self.event_name(raw["event"], f"{path}.event")
        ok = self.event_key(raw.get("key"), f"{path}.key", ancestors) and ok
        sender = raw.get("from")
        if sender is not None and (not isinstance(sender, str) or not sender):
            self.error(f"{path}.from", "from must be the key of the workflow that emits the event")
            ok = False
        lookback: Any = raw.get("lookback_s")
        if lookback is not None and (
            not is_number(lookback) or not 0 <= lookback <= MAX_EVENT_LOOKBACK_S
        ):
            self.error(
                f"{path}.lookback_s",
                f"lookback_s must be a number of seconds with 0 <= lookback_s <="
                f" {MAX_EVENT_LOOKBACK_S}",
            )
            ok = False
        if not ok:
            return None
        return EventWait(
            raw["event"], raw["key"], sender, None if lookback is None else float(lookback)
        )

    def emits(self, doc: dict[str, Any]) -> EventEmit | None:
        """`emits`: the event each verified delivery of the workflow sends, its key rendered
        from the delivery (only `input` can be read)."""
        if "emits" not in doc:
            return None
        raw = doc["emits"]
        if not isinstance(raw, dict):
            self.error("$.emits", "emits must be an object with event and key")
            return None
        self.unknown_keys(raw, _EMITS_KEYS, "$.emits")
        ok = self.event_name(raw.get("event"), "$.emits.event")
        ok = self.event_key(raw.get("key"), "$.emits.key", frozenset()) and ok
        return EventEmit(raw["event"], raw["key"]) if ok else None
