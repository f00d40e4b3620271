"""A version's `input_schema` (docs/contract.md#input-schema): JSON Schema 2020-12 every webhook
body must satisfy, checked with the `jsonschema` library.

- At publish, the schema itself is checked against the 2020-12 metaschema, and every
  `$ref` must point inside it: nothing is ever fetched, and nothing can fail to resolve
  later, when a webhook arrives.
- At intake, a body that fails gets a 422 listing each error's path (at most MAX_ERRORS;
  errors are produced lazily, so a huge array of wrong items costs only that many).
  Messages name the schema keyword that failed, never the sent value (bodies may carry
  private data, and problem answers are logged).
- Cost: jsonschema walks the body in Python, tens of microseconds per value, so a body
  within FLOWFORGE_MAX_BODY_BYTES (a megabyte holds half a million numbers) could cost
  many seconds of a sync worker. A schema-checked body may hold at most MAX_VALUES JSON
  values; a larger one is refused (413) before validation. Nesting is already bounded by
  flowforge.domain.jsonvalues.MAX_DEPTH.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from flowforge.errors import ClientError

MAX_ERRORS = 100
MAX_VALUES = 10_000
DIALECT = "https://json-schema.org/draft/2020-12/schema"
_REF_KEYWORDS = ("$ref", "$dynamicRef")


class InputInvalid(ClientError):
    """The webhook body does not satisfy the workflow's input schema."""

    status = 422
    title = "Input does not match the schema"


class InputTooLarge(ClientError):
    """The webhook body holds too many values to be checked against the input schema."""

    status = 413
    title = "Payload too large"


def problems(schema: Any, path: str) -> list[dict[str, str]]:
    """Why `schema` cannot serve as an input schema (empty when it can); each entry names
    the JSON path of the offending part below `path`."""
    if not isinstance(schema, dict | bool):
        return [{"path": path, "message": "input_schema must be a JSON Schema (object or boolean)"}]
    if isinstance(schema, dict) and schema.get("$schema", DIALECT) != DIALECT:
        return [{"path": f"{path}.$schema", "message": f"only {DIALECT} is supported"}]
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as error:
        return [{"path": path + error.json_path[1:], "message": _keyword_message(error)}]
    found = []
    resolver = Registry().resolver_with_root(DRAFT202012.create_resource(schema))
    for where, keyword, value in _keywords(schema, path):
        if keyword == "$id" and where != path:
            found.append({"path": f"{where}.$id", "message": "$id is allowed at the root only"})
        elif keyword in _REF_KEYWORDS:
            if not value.startswith("#"):
                found.append(
                    {"path": f"{where}.{keyword}", "message": "only local references (#...)"}
                )
                continue
            try:
                resolver.lookup(value)
            except Unresolvable:
                found.append(
                    {"path": f"{where}.{keyword}", "message": f"{value!r} resolves to nothing"}
                )
    return found


def validator(schema: Any) -> Draft202012Validator:
    """A validator for a schema `problems` accepted (built once per cached intake target)."""
    return Draft202012Validator(schema)


def check(checker: Draft202012Validator, body: Any) -> None:
    """Raise InputTooLarge or InputInvalid (with every error's path, up to MAX_ERRORS)
    unless the parsed webhook body satisfies the schema."""
    if _more_values_than(body, MAX_VALUES):
        raise InputTooLarge(
            f"a webhook checked against an input schema may hold at most {MAX_VALUES} JSON "
            "values (objects, arrays, members and items together)"
        )
    errors = list(itertools.islice(checker.iter_errors(body), MAX_ERRORS + 1))
    if not errors:
        return
    if len(errors) > MAX_ERRORS:
        summary = f"more than {MAX_ERRORS} errors; the first {MAX_ERRORS} are listed"
    else:
        summary = f"{len(errors)} error(s), each listed with its path"
    exc = InputInvalid(f"the body does not satisfy the input schema: {summary}")
    exc.errors = [
        {"path": error.json_path, "message": _keyword_message(error)}
        for error in errors[:MAX_ERRORS]
    ]
    raise exc


def _keyword_message(error: Any) -> str:
    """What failed, from the schema's side: `type` "string", `required` ["id"]."""
    expected = json.dumps(error.validator_value)
    if len(expected) > 200:
        expected = expected[:197] + "..."
    return f"fails {error.validator} {expected}"


def _keywords(schema: Any, path: str) -> Iterator[tuple[str, str, str]]:
    """(path of the object, keyword, value) of every string-valued $id/$ref/$dynamicRef."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in ("$id", *_REF_KEYWORDS) and isinstance(value, str):
                yield path, key, value
            elif key not in ("const", "enum", "default", "examples"):
                yield from _keywords(value, f"{path}.{key}")
    elif isinstance(schema, list):
        for index, item in enumerate(schema):
            yield from _keywords(item, f"{path}[{index}]")


def _more_values_than(body: Any, limit: int) -> bool:
    """Whether the body holds more than `limit` JSON values; stops as soon as it does."""
    seen = 0
    pending = [body]
    while pending:
        value = pending.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return False
