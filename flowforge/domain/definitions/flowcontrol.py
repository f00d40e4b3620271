"""Flow control: `concurrency` (docs/contract.md#flow-control) and `priority`
(docs/contract.md#priority), checked at publish and rendered per execution from its input."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from flowforge.domain import templating
from flowforge.domain.definitions.bounds import (
    DEFAULT_PRIORITY,
    MAX_CONCURRENCY_LIMIT,
    MAX_KEY_CHARS,
    MAX_PRIORITY,
    MAX_QUEUED,
    MAX_TEMPLATE_CHARS,
    MIN_PRIORITY,
)
from flowforge.domain.definitions.checker import Checker, is_whole
from flowforge.domain.definitions.shapes import ON_FULL, SCHEDULE_KEY, Concurrency
from flowforge.domain.model import OnFull
from flowforge.errors import ClientError

if TYPE_CHECKING:
    from flowforge.domain.definitions.shapes import Definition

_CONCURRENCY_KEYS = frozenset({"limit", "key", "on_full", "max_queued"})


class PriorityInvalid(ClientError):
    """The priority template rendered to something that is not a priority: the webhook
    is refused and nothing is stored (docs/contract.md#priority)."""

    status = 422
    title = "Priority invalid"


class KeyUnrendered(ValueError):
    """A concurrency key template that does not render to a usable key for this input."""


def render_concurrency_key(definition: Definition, input_value: Any) -> str | None:
    """An execution's concurrency key from its input: '' for one queue per workflow, None
    without a limit. Pure, so the engine (a child's admission, docs/contract.md#child-workflows) and
    the intake (flowcontrol.concurrency_key) apply the same rules."""
    concurrency = definition.concurrency
    if concurrency is None:
        return None
    if concurrency.key is None:
        return ""
    try:
        value = templating.render(concurrency.key, {"input": input_value})
    except templating.TemplateError as exc:
        raise KeyUnrendered(f"concurrency key {concurrency.key!r}: {exc}") from None
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if len(text) > MAX_KEY_CHARS or "\x00" in text:
        raise KeyUnrendered(
            f"concurrency key must render to at most {MAX_KEY_CHARS} characters without NUL"
        )
    if text == SCHEDULE_KEY:
        raise KeyUnrendered(f"concurrency key {SCHEDULE_KEY!r} is reserved for schedules")
    return text


def lone_placeholder(text: str) -> bool:
    """Whether text is exactly one `{{ path }}`, with nothing around it."""
    stripped = text.strip()
    return (
        stripped == text
        and stripped.startswith("{{")
        and stripped.endswith("}}")
        and stripped.count("{{") == 1
    )


def execution_priority(definition: Definition, input_value: Any) -> int:
    """The priority a new execution gets (docs/contract.md#priority): the definition's literal, or
    its template rendered against the input. A path the input does not have, or null, is the
    default 0 (a priority is optional for the sender); any other value that is not an
    integer in range raises PriorityInvalid, so the webhook is refused (422) with nothing
    stored — never clamped, which would hide a sender's mistake."""
    template = definition.priority
    if not isinstance(template, str):
        return template
    try:
        value = templating.render(template, {"input": input_value})
    except templating.TemplateError:
        return DEFAULT_PRIORITY
    if value is None:
        return DEFAULT_PRIORITY
    if not is_whole(value) or not MIN_PRIORITY <= value <= MAX_PRIORITY:
        # The JSON type only: the sender's value is never echoed (problem answers are
        # logged, and shown to whoever sent it; docs/reference/security.md).
        shown = (
            "an integer out of range"
            if is_whole(value)
            else f"a JSON {templating.json_type(value)}"
        )
        raise PriorityInvalid(
            f"priority {template!r} rendered to {shown}, not an integer from "
            f"{MIN_PRIORITY} to {MAX_PRIORITY}"
        )
    return int(value)


class FlowControlSection(Checker):
    """`concurrency` and `priority`."""

    def concurrency(self, doc: dict[str, Any]) -> Concurrency | None:
        """Check `concurrency`: a positive limit, a key over input only, a known on_full."""
        if "concurrency" not in doc:
            return None
        raw = doc["concurrency"]
        path = "$.concurrency"
        if not isinstance(raw, dict):
            self.error(path, "concurrency must be an object with limit, key, on_full, max_queued")
            return None
        self.unknown_keys(raw, _CONCURRENCY_KEYS, path)
        limit: Any = raw.get("limit")
        if not is_whole(limit) or not 1 <= limit <= MAX_CONCURRENCY_LIMIT:
            self.error(
                f"{path}.limit", f"limit is required: an integer from 1 to {MAX_CONCURRENCY_LIMIT}"
            )
        key = raw.get("key")
        if "key" in raw:
            self.concurrency_key(key, f"{path}.key")
        on_full = raw.get("on_full", "queue")
        if on_full not in ON_FULL:
            self.error(f"{path}.on_full", f"on_full must be one of {', '.join(ON_FULL)}")
        max_queued: Any = raw.get("max_queued")
        if "max_queued" in raw and (not is_whole(max_queued) or not 1 <= max_queued <= MAX_QUEUED):
            self.error(
                f"{path}.max_queued", f"max_queued must be an integer from 1 to {MAX_QUEUED}"
            )
        if not is_whole(limit) or on_full not in ON_FULL:
            return None
        return Concurrency(
            limit, key if isinstance(key, str) else None, OnFull(on_full), max_queued
        )

    def priority(self, doc: dict[str, Any]) -> int | str:
        """Check `priority`: an integer in [MIN_PRIORITY, MAX_PRIORITY], or exactly one
        placeholder over `input` — rendered once, when the execution is created, from the
        webhook's body alone (so never a secret, nor anything that exists only later)."""
        if "priority" not in doc:
            return DEFAULT_PRIORITY
        value = doc["priority"]
        path = "$.priority"
        message = (
            f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, or a "
            "template of one placeholder over input, such as {{ input.priority }}"
        )
        if is_whole(value):
            if MIN_PRIORITY <= value <= MAX_PRIORITY:
                return int(value)
            self.error(path, message)
            return DEFAULT_PRIORITY
        if not isinstance(value, str) or len(value) > MAX_TEMPLATE_CHARS:
            self.error(path, message)
            return DEFAULT_PRIORITY
        try:
            placeholders = templating.find_placeholders(value)
        except templating.TemplateSyntaxError as error:
            self.error(path, str(error))
            return DEFAULT_PRIORITY
        if len(placeholders) != 1 or not lone_placeholder(value):
            self.error(path, message)
            return DEFAULT_PRIORITY
        if placeholders[0].split(".")[0] != "input" or "." not in placeholders[0]:
            self.error(
                path, f"{placeholders[0]!r}: a priority reads one value of input, nothing else"
            )
            return DEFAULT_PRIORITY
        return value
