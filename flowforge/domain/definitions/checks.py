"""The checks every section of the definition parser shares: recording a problem, unknown
keys, the document's size limits, and what a template may read (docs/contract.md#templates)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flowforge.domain import templating
from flowforge.domain.definitions.bounds import (
    MAX_NESTING_DEPTH,
    MAX_STRING_CHARS,
    MAX_TEMPLATE_CHARS,
)
from flowforge.domain.definitions.checker import Checker, Choice
from flowforge.domain.definitions.shapes import EXECUTION_FIELDS
from flowforge.errors import ClientError

_SECRETS_MESSAGE = "secrets may only be used in http_request requests: outputs are stored"
_WAITS_MESSAGE = (
    "waits may only be used in http_request requests: a resume URL is a credential and"
    " outputs are stored"
)


class DefinitionInvalid(ClientError):
    """The workflow definition breaks the rules of docs/contract.md#definition."""

    status = 422
    title = "Invalid definition"
    errors: list[dict[str, str]]

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{error['path']}: {error['message']}" for error in errors))
        self.errors = errors

    @property
    def detail(self) -> str:
        """A count: each problem is in `errors`, with its JSON path."""
        return f"the definition has {len(self.errors)} problem(s)"


class Checks(Checker):
    """Walks one definition, recording every problem with its JSON path."""

    def __init__(self, stored: bool) -> None:
        self.errors: list[dict[str, str]] = []
        self.stored = stored
        self.wait_ids: frozenset[str] = frozenset()
        self.top_ids: frozenset[str] = frozenset()
        self.limit_names: frozenset[str] = frozenset()

    def error(self, path: str, message: str) -> None:
        """Record a problem and carry on, so the author sees them all in one reply."""
        self.errors.append({"path": path, "message": message})

    def unknown_keys(self, value: dict[str, Any], allowed: Iterable[str], path: str) -> None:
        """Report keys the format does not know, in document order: usually a typo."""
        names = sorted(allowed)
        for key in value:
            if key not in names:
                self.error(f"{path}.{key}", f"unknown key {key!r}; allowed: {', '.join(names)}")

    def check_limits(self, value: Any, path: str, depth: int) -> None:
        """Enforce nesting depth and string length over the whole document."""
        if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
            self.error(path, f"string exceeds the limit of {MAX_STRING_CHARS} characters")
        if not isinstance(value, dict | list):
            return
        if depth > MAX_NESTING_DEPTH:
            self.error(path, f"nesting exceeds the limit of depth {MAX_NESTING_DEPTH}")
            return
        if isinstance(value, dict):
            if any(len(key) > MAX_STRING_CHARS for key in value):
                self.error(path, f"a key exceeds the limit of {MAX_STRING_CHARS} characters")
            children = [(f"{path}.{key}", item) for key, item in value.items()]
        else:
            children = [(f"{path}[{index}]", item) for index, item in enumerate(value)]
        for where, item in children:
            self.check_limits(item, where, depth + 1)

    def concurrency_key(self, key: Any, path: str) -> None:
        """A key is rendered at intake from the webhook body alone, and it is stored: it may
        read `input` only — never a secret, and nothing that exists only later."""
        if not isinstance(key, str) or not key:
            self.error(path, "key must be a non-empty template, such as {{ input.customer }}")
            return
        if len(key) > MAX_TEMPLATE_CHARS:
            self.error(path, f"template exceeds the limit of {MAX_TEMPLATE_CHARS} characters")
            return
        try:
            placeholders = templating.find_placeholders(key)
        except templating.TemplateSyntaxError as error:
            self.error(path, str(error))
            return
        for dotted in placeholders:
            head = dotted.split(".")[0]
            if head == "secrets":
                self.error(path, f"{dotted!r}: a concurrency key is stored: no secrets")
            elif head != "input":
                self.error(path, f"{dotted!r}: a concurrency key may read input only")

    def choice(
        self, raw: dict[str, Any], name: str, default: Choice, path: str, message: str
    ) -> Choice:
        """A field that takes one member of a closed set: the default when left out; on
        anything else a problem, and the default, so the walk goes on."""
        value = raw.get(name, default)
        if value not in tuple(type(default)):
            self.error(f"{path}.{name}", message)
            return default
        return type(default)(value)

    def templates(self, value: Any, path: str, ancestors: frozenset[str], *, secrets: bool) -> None:
        """Check the syntax and the scope of every template string under a value."""
        for where, text in templating.iter_template_strings(value, path):
            if len(text) > MAX_TEMPLATE_CHARS:
                self.error(where, f"template exceeds the limit of {MAX_TEMPLATE_CHARS} characters")
                continue
            try:
                placeholders = templating.find_placeholders(text)
            except templating.TemplateSyntaxError as error:
                self.error(where, str(error))
                continue
            for placeholder in placeholders:
                self.reference(placeholder, where, ancestors, secrets=secrets)

    def reference(
        self, dotted: str, path: str, ancestors: frozenset[str], *, secrets: bool
    ) -> None:
        """Check that a path reads something that will exist when the step runs."""
        head, *rest = dotted.split(".")
        if head == "secrets":
            if not secrets:
                self.error(path, _SECRETS_MESSAGE)
            elif len(rest) != 1:
                self.error(path, f"{dotted!r}: name one secret, as secrets.NAME")
            elif not self.stored and rest[0].upper().endswith("_WORKFLOWS"):
                # FLOWFORGE_SECRET_<NAME>_WORKFLOWS binds secret NAME to workflows. A rule
                # newer than some stored versions: those must still load (and run).
                self.error(path, f"{dotted!r}: secret names may not end in _workflows")
        elif head == "waits":
            if not secrets:
                self.error(path, _WAITS_MESSAGE)
            elif len(rest) != 2 or rest[1] != "url":
                self.error(path, f"{dotted!r}: a resume URL is named as waits.STEP.url")
            elif rest[0] not in self.wait_ids:
                self.error(path, f"{dotted!r}: {rest[0]!r} is not a wait step of this workflow")
        elif head == "execution":
            if len(rest) != 1 or rest[0] not in EXECUTION_FIELDS:
                self.error(path, f"{dotted!r}: execution has only {', '.join(EXECUTION_FIELDS)}")
        elif head != "input" and head not in ancestors:
            self.error(
                path,
                f"{dotted!r}: {head!r} is not input, execution, secrets"
                " or a step this one depends on (directly or through its parents)",
            )
