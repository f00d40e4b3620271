"""`attributes` (docs/contract.md#search-attributes): named search values of an execution,
each a template over the webhook's `input`, checked at publish and rendered when the
execution is created (flowforge/usecases/intake.py), stored in sql/0062's table.

A value that cannot be rendered never refuses the webhook: a missing path, null, an empty
string, a value over MAX_ATTRIBUTE_CHARS characters or one holding NUL stores nothing for
that attribute (the execution is simply not found by it), since a search aid must not cost
a sender its delivery. A value is text: a string as it is, any other JSON value as its JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flowforge.domain import templating
from flowforge.domain.definitions.bounds import (
    ATTRIBUTE_NAME,
    MAX_ATTRIBUTE_CHARS,
    MAX_ATTRIBUTES,
    MAX_TEMPLATE_CHARS,
)
from flowforge.domain.definitions.checker import Checker
from flowforge.errors import ClientError

if TYPE_CHECKING:
    from flowforge.domain.definitions.shapes import Definition

_NAME = re.compile(ATTRIBUTE_NAME)


def is_attribute_name(text: str) -> bool:
    """Whether `text` may name an attribute (the definition's and a filter's rule)."""
    return _NAME.fullmatch(text) is not None


def attribute_value(value: Any) -> str | None:
    """A rendered value as it is stored and matched, or None when nothing is stored:
    null, "", too long, or holding NUL or an unpaired surrogate (which PostgreSQL text
    cannot hold; a filter's value from argv can: surrogateescape)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if not text or len(text) > MAX_ATTRIBUTE_CHARS or "\x00" in text or not _storable(text):
        return None
    return text


def _storable(text: str) -> bool:
    """Whether UTF-8 can carry `text` (no unpaired surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def render_attributes(definition: Definition, input_value: Any) -> dict[str, str]:
    """The attributes a new execution stores, by name: those that render to a value.
    Pure, and never raises for an input: a template that cannot render stores nothing."""
    found: dict[str, str] = {}
    for name, template in definition.attributes:
        try:
            rendered = templating.render(template, {"input": input_value})
        except templating.TemplateError:
            continue
        value = attribute_value(rendered)
        if value is not None:
            found[name] = value
    return found


class AttributesSection(Checker):
    """`attributes`: an object of at most MAX_ATTRIBUTES names, each a template over input."""

    def attributes(self, doc: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        """Check `attributes`: names of ATTRIBUTE_NAME, templates reading `input` only
        (they are rendered at intake and stored: never a secret, nothing that exists
        later), each with at least one placeholder."""
        if "attributes" not in doc:
            return ()
        raw = doc["attributes"]
        path = "$.attributes"
        if not isinstance(raw, dict):
            self.error(path, 'attributes must be an object: {"order_id": "{{ input.order_id }}"}')
            return ()
        if len(raw) > MAX_ATTRIBUTES:
            self.error(path, f"{len(raw)} attributes exceed the limit of {MAX_ATTRIBUTES}")
        found = []
        for name, template in raw.items():
            where = f"{path}.{name}"
            if not is_attribute_name(name):
                self.error(
                    where,
                    f"{name!r}: an attribute name is lowercase letters, digits and '_',"
                    " starting with a letter, at most 40 characters",
                )
                continue
            if self._attribute_template(template, where):
                found.append((name, template))
        return tuple(found)

    def _attribute_template(self, template: Any, path: str) -> bool:
        if not isinstance(template, str) or not template:
            self.error(path, "an attribute is a template such as {{ input.order_id }}")
            return False
        if len(template) > MAX_TEMPLATE_CHARS:
            self.error(path, f"template exceeds the limit of {MAX_TEMPLATE_CHARS} characters")
            return False
        try:
            placeholders = templating.find_placeholders(template)
        except templating.TemplateSyntaxError as error:
            self.error(path, str(error))
            return False
        if not placeholders:
            self.error(path, "an attribute reads the input: it needs a {{ input.PATH }}")
            return False
        ok = True
        for dotted in placeholders:
            head = dotted.split(".")[0]
            if head == "secrets":
                self.error(path, f"{dotted!r}: an attribute is stored and shown: no secrets")
                ok = False
            elif head != "input":
                self.error(path, f"{dotted!r}: an attribute may read input only")
                ok = False
        return ok


class AttributeFilterInvalid(ClientError):
    """A filter by search attributes names no attribute or no value one could hold: 422,
    each bad one by its parameter (`attr.NAME`, `--where`, `$.filter.attributes.NAME`)."""

    status = 422
    title = "Invalid attribute filter"

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{error['path']}: {error['message']}" for error in errors))
        self.errors = errors


def attribute_filter(pairs: Iterable[tuple[str, str, Any]]) -> tuple[tuple[str, str], ...]:
    """A filter `name = value` per (where, name, value), `where` the parameter as its
    caller spells it; every one must hold: at most MAX_ATTRIBUTES, each name a valid
    attribute name named once, each value text a stored value could be (1 to
    MAX_ATTRIBUTE_CHARS characters, no NUL). Raises AttributeFilterInvalid naming each."""
    errors: list[dict[str, str]] = []
    found: dict[str, str] = {}
    for where, name, value in pairs:
        if not isinstance(name, str) or not is_attribute_name(name):
            errors.append(
                {
                    "path": where,
                    "message": "an attribute name is lowercase letters, digits and '_',"
                    " starting with a letter, at most 40 characters",
                }
            )
        elif name in found:
            errors.append({"path": where, "message": f"attribute {name!r} is named twice"})
        elif not isinstance(value, str) or attribute_value(value) != value:
            errors.append(
                {
                    "path": where,
                    "message": f"a value is text of 1 to {MAX_ATTRIBUTE_CHARS} characters"
                    " without NUL or unpaired surrogate (an attribute that rendered empty"
                    " is not stored)",
                }
            )
        else:
            found[name] = value
    if len(found) > MAX_ATTRIBUTES:
        errors.append(
            {"path": "attr", "message": f"at most {MAX_ATTRIBUTES} attributes in one filter"}
        )
    if errors:
        raise AttributeFilterInvalid(errors)
    return tuple(found.items())
