"""{{ dotted.path }} resolution over JSON values, nothing more: no expressions, no code."""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

from flowforge.domain.jsonvalues import is_number
from flowforge.errors import FlowForgeError

_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_PATH = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
_INDEX = re.compile(r"[0-9]+")

_ORDERING: dict[str, Callable[[Any, Any], bool]] = {
    "gt": operator.gt,
    "gte": operator.ge,
    "lt": operator.lt,
    "lte": operator.le,
}


class TemplateError(FlowForgeError):
    """A template could not be rendered against its context."""


class TemplateSyntaxError(TemplateError):
    """A template is not made of {{ dotted.path }} placeholders."""


def is_path(text: str) -> bool:
    """Tell whether text is a dotted path a template may name (no dunder segments)."""
    return _PATH.fullmatch(text) is not None and not any(
        segment.startswith("__") for segment in text.split(".")
    )


def _split(text: str) -> tuple[list[str], list[str]]:
    """Cut text into literal pieces and the paths between them (len(literals) == len(paths)+1)."""
    literals: list[str] = []
    paths: list[str] = []
    start = 0
    for match in _PLACEHOLDER.finditer(text):
        literals.append(_literal(text[start : match.start()]))
        path = match.group(1).strip()
        if not is_path(path):
            raise TemplateSyntaxError(
                f"{match.group(0)!r}: a placeholder holds only a dotted path of letters, digits,"
                " '_' and '-' (no filters, calls, quotes or '__' segments)"
            )
        paths.append(path)
        start = match.end()
    literals.append(_literal(text[start:]))
    return literals, paths


def _literal(text: str) -> str:
    """Reject an unclosed '{{' so a typo cannot pass as plain text; a lone '}}' is text,
    since literal JSON bodies such as {"a":{"b":1}} end with one."""
    if "{{" in text:
        raise TemplateSyntaxError(f"{text!r}: '{{{{' is never closed by '}}}}'")
    return text


def find_placeholders(text: str) -> list[str]:
    """List the paths a string refers to, so a definition can be checked before it runs."""
    return _split(text)[1]


def iter_template_strings(value: Any, path: str = "$") -> Iterator[tuple[str, str]]:
    """Find every string meant as a template, with its JSON path for error messages."""
    if isinstance(value, str):
        if "{{" in value or "}}" in value:
            yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from iter_template_strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from iter_template_strings(item, f"{path}[{index}]")


def json_type(value: Any) -> str:
    """Name a value's JSON type, the vocabulary definition authors know."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def resolve_path(context: Mapping[str, Any], dotted: str) -> Any:
    """Look a path up so that a miss names the exact segment that failed."""
    current: Any = context
    walked: list[str] = []
    for segment in dotted.split("."):
        where = ".".join(walked) or "the context"
        if isinstance(current, Mapping):
            if segment not in current:
                raise TemplateError(f"{{{{ {dotted} }}}}: {segment!r} not found in {where}")
            current = current[segment]
        elif isinstance(current, list):
            if not _INDEX.fullmatch(segment):
                raise TemplateError(
                    f"{{{{ {dotted} }}}}: {where} is an array, {segment!r} is no index"
                )
            if int(segment) >= len(current):
                raise TemplateError(
                    f"{{{{ {dotted} }}}}: index {segment} out of range in {where}"
                    f" (length {len(current)})"
                )
            current = current[int(segment)]
        else:
            raise TemplateError(
                f"{{{{ {dotted} }}}}: {where} is a {json_type(current)}, it has no {segment!r}"
            )
        walked.append(segment)
    return current


def _as_text(value: Any) -> str:
    """Spell a value the way JSON would, except that strings stay bare and null is empty."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":"))


def render(value: Any, context: Mapping[str, Any]) -> Any:
    """Resolve placeholders in a JSON value; a lone placeholder keeps its value's JSON type."""
    if isinstance(value, dict):
        return {key: render(item, context) for key, item in value.items()}
    if isinstance(value, list):
        return [render(item, context) for item in value]
    if not isinstance(value, str):
        return value
    literals, paths = _split(value)
    if literals == ["", ""]:
        return resolve_path(context, paths[0])
    pieces = [literals[0]]
    for path, literal in zip(paths, literals[1:], strict=True):
        pieces += [_as_text(resolve_path(context, path)), literal]
    return "".join(pieces)


def render_url(template: str, context: Mapping[str, Any]) -> str:
    """Build a URL in which rendered values cannot add path segments or query parameters."""
    literals, paths = _split(template)
    if literals == ["", ""]:
        url = resolve_path(context, paths[0])
        if not isinstance(url, str):
            raise TemplateError(
                f"{{{{ {paths[0]} }}}}: a whole URL must be a string, not a {json_type(url)}"
            )
        return url
    pieces = [literals[0]]
    for path, literal in zip(paths, literals[1:], strict=True):
        pieces += [quote(_as_text(resolve_path(context, path)), safe=""), literal]
    return "".join(pieces)


def _json_equal(left: Any, right: Any) -> bool:
    """Compare as JSON does, where true is not 1 (Python's == says it is)."""
    if isinstance(left, bool) or isinstance(right, bool):
        return left is right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_json_equal, left, right))
    return bool(left == right)


def evaluate_condition(condition: Mapping[str, Any], context: Mapping[str, Any]) -> bool:
    """Decide a step's `when`, failing loudly on a missing path rather than guessing."""
    path, op = condition["path"], condition["op"]
    if op == "exists":
        try:
            resolve_path(context, path)
        except TemplateError:
            return False
        return True
    actual, expected = resolve_path(context, path), condition["value"]
    if op == "eq":
        return _json_equal(actual, expected)
    if op == "ne":
        return not _json_equal(actual, expected)
    if op == "in":
        return any(_json_equal(actual, item) for item in expected)
    if op in _ORDERING:
        comparable = (is_number(actual) and is_number(expected)) or (
            isinstance(actual, str) and isinstance(expected, str)
        )
        return comparable and _ORDERING[op](actual, expected)
    raise TemplateError(f"when {path}: unknown op {op!r}")
