"""`trigger.webhook`: how webhooks authenticate, and whether they are gathered by debounce
or batch before one execution starts (docs/contract.md#debounce-batch)."""

from __future__ import annotations

from typing import Any

from flowforge.domain.definitions.bounds import (
    DEFAULT_MAX_WAIT_WINDOWS,
    MAX_BATCH_ITEMS,
    MAX_DEBOUNCE_WAIT_S,
    MAX_GROUP_WINDOW_S,
    MIN_GROUP_WINDOW_S,
)
from flowforge.domain.definitions.checker import Checker, is_whole
from flowforge.domain.definitions.shapes import Grouping
from flowforge.domain.jsonvalues import is_number
from flowforge.domain.model import WebhookAuth

_DEBOUNCE_KEYS = frozenset({"key", "window_s", "max_wait_s"})
_BATCH_KEYS = frozenset({"key", "max_items", "window_s"})


class WebhookSection(Checker):
    """`trigger` and `trigger.webhook`."""

    def webhook_auth(self, doc: dict[str, Any]) -> str:
        """Read how webhooks authenticate; signatures unless the author opts out."""
        if "trigger" not in doc:
            return "signature"
        trigger = doc["trigger"]
        if not isinstance(trigger, dict) or not (
            isinstance(trigger.get("webhook"), dict) or "schedule" in trigger
        ):
            self.error(
                "$.trigger",
                'trigger must be {"webhook": {"auth": "signature"|"none"}, "schedule": {...}}'
                " with either or both",
            )
            return "signature"
        self.unknown_keys(trigger, {"webhook", "schedule"}, "$.trigger")
        if "webhook" not in trigger:
            return "signature"
        webhook = trigger["webhook"]
        if not isinstance(webhook, dict):
            self.error(
                "$.trigger.webhook", 'webhook must be an object such as {"auth": "signature"}'
            )
            return "signature"
        self.unknown_keys(webhook, {"auth", "debounce", "batch"}, "$.trigger.webhook")
        auth = webhook.get("auth", "signature")
        if not isinstance(auth, str) or auth not in set(WebhookAuth):
            self.error(
                "$.trigger.webhook.auth",
                f"auth must be one of {', '.join(sorted(WebhookAuth))}",
            )
            return "signature"
        return str(auth)

    def grouping(self, doc: dict[str, Any]) -> Grouping | None:
        """Check `trigger.webhook.debounce` / `.batch` (docs/contract.md#debounce-batch): one of
        them at most, a key template over input only, windows of
        MIN_GROUP_WINDOW_S..MAX_GROUP_WINDOW_S, a max wait from the window to MAX_DEBOUNCE_WAIT_S,
        1..MAX_BATCH_ITEMS items."""
        trigger = doc.get("trigger")
        webhook = trigger.get("webhook") if isinstance(trigger, dict) else None
        if not isinstance(webhook, dict):
            return None
        kinds = [kind for kind in ("debounce", "batch") if kind in webhook]
        if not kinds:
            return None
        if len(kinds) == 2:
            self.error(
                "$.trigger.webhook.batch", "debounce and batch exclude each other: choose one"
            )
            return None
        kind = kinds[0]
        path = f"$.trigger.webhook.{kind}"
        raw = webhook[kind]
        allowed = _DEBOUNCE_KEYS if kind == "debounce" else _BATCH_KEYS
        if not isinstance(raw, dict):
            self.error(path, f"{kind} must be an object with {', '.join(sorted(allowed))}")
            return None
        before = len(self.errors)
        self.unknown_keys(raw, allowed, path)
        key = raw.get("key")
        if "key" in raw:
            self.concurrency_key(key, f"{path}.key")
        window: Any = raw.get("window_s")
        if not is_number(window) or not MIN_GROUP_WINDOW_S <= window <= MAX_GROUP_WINDOW_S:
            self.error(
                f"{path}.window_s",
                f"window_s is required: seconds in [{MIN_GROUP_WINDOW_S:.0f}, "
                f"{MAX_GROUP_WINDOW_S:.0f}]",
            )
        if kind == "debounce":
            max_wait: Any = raw.get("max_wait_s")
            if "max_wait_s" in raw and not (
                is_number(max_wait)
                and is_number(window)
                and window <= max_wait <= MAX_DEBOUNCE_WAIT_S
            ):
                self.error(
                    f"{path}.max_wait_s",
                    f"max_wait_s must be seconds from window_s to {MAX_DEBOUNCE_WAIT_S:.0f}",
                )
            if len(self.errors) > before:
                return None
            if max_wait is None:
                max_wait = min(MAX_DEBOUNCE_WAIT_S, DEFAULT_MAX_WAIT_WINDOWS * window)
            return Grouping(kind, float(window), key, max_wait_s=float(max_wait))
        items: Any = raw.get("max_items")
        if not is_whole(items) or not 1 <= items <= MAX_BATCH_ITEMS:
            self.error(
                f"{path}.max_items",
                f"max_items is required: an integer from 1 to {MAX_BATCH_ITEMS}",
            )
        if len(self.errors) > before:
            return None
        return Grouping(kind, float(window), key, max_items=int(items))
