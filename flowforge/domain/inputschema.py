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
- The bound no schema can lift (docs/reference/input-schema.md, security.md): patterns
  (`pattern`, `patternProperties`, and through them `propertyNames` and
  `additionalProperties`) run on RE2, whose time is linear in the text, so no pattern can
  backtrack; one RE2 cannot run (backreferences, lookaround) is refused at publish. A
  `$ref` loop that never descends into the body is refused at publish too, and every
  check has a budget of MAX_EVALUATIONS keyword evaluations (a schema whose applicators
  multiply its work per value answers 422 past it, in bounded time).
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

import re2
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from flowforge.errors import ClientError

MAX_ERRORS = 100
MAX_VALUES = 10_000
# Evaluations one body's check may cost (a keyword one, a reference _REF_COST, a pattern
# search one per started kilobyte): ten per value at MAX_VALUES (an ordinary schema spends
# two to five), about a second at the slowest (tests/bench/schema_bounds.py;
# docs/reference/input-schema.md), well within a gunicorn worker's timeout.
MAX_EVALUATIONS = 100_000
DIALECT = "https://json-schema.org/draft/2020-12/schema"
_REF_KEYWORDS = ("$ref", "$dynamicRef")


class InputInvalid(ClientError):
    """The webhook body does not satisfy the workflow's input schema."""

    status = 422
    title = "Input does not match the schema"


class InputTooCostly(InputInvalid):
    """Checking the body against the schema needs more than MAX_EVALUATIONS evaluations:
    refused as input that does not match (whoever handles one handles the other)."""


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
    resolver = Registry().resolver_with_root(DRAFT202012.create_resource(schema))
    nodes = _subschemas(schema, path, resolver)
    found = []
    for where, node in nodes:
        if "$id" in node and node is not schema:
            found.append({"path": f"{where}.$id", "message": "$id is allowed at the root only"})
        for keyword in _REF_KEYWORDS:
            if isinstance(node.get(keyword), str):
                problem = _reference_problem(node[keyword], resolver)
                if problem:
                    found.append({"path": f"{where}.{keyword}", "message": problem})
        patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        if any(_compiled(p) is None for p in patterns):
            found.append({"path": f"{where}.pattern", "message": _UNSUPPORTED})
        if any(_compiled(p) is None for p in node.get("patternProperties", {})):
            found.append({"path": f"{where}.patternProperties", "message": _UNSUPPORTED})
    if found:
        return found
    if any("patternProperties" in node for _, node in nodes):
        # jsonschema evaluates unevaluatedProperties' patternProperties with Python's re.
        found += [
            {"path": f"{where}.unevaluatedProperties", "message": _NOT_WITH_PATTERNS}
            for where, node in nodes
            if "unevaluatedProperties" in node
        ]
    return found + _ref_loops(nodes, resolver)


_UNSUPPORTED = (
    "a pattern the linear-time engine (RE2) runs: no backreferences or lookaround "
    "(docs/reference/input-schema.md)"
)
_NOT_WITH_PATTERNS = "not with patternProperties in the schema"
# Where 2020-12 keywords hold subschemas: one, an array of them, a map of them. Any other
# value (enum, const, default, examples, unknown keywords) is data, never a schema, unless
# a reference points at it.
_SCHEMA = (
    "not", "if", "then", "else", "items", "contains", "additionalProperties",
    "unevaluatedProperties", "unevaluatedItems", "propertyNames", "contentSchema",
)  # fmt: skip
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas", "$defs")
# Keywords whose subschemas apply to the same value: a $ref cycle through only these never
# reaches the end of the body, and recurses until the stack is gone.
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE = ("not", "if", "then", "else")


def _reference_problem(value: str, resolver: Any) -> str | None:
    """Why a $ref/$dynamicRef cannot serve (None when it can): local, resolving to a schema."""
    if not value.startswith("#"):
        return "only local references (#...)"
    try:
        target = resolver.lookup(value).contents
    except Unresolvable:
        return f"{value!r} resolves to nothing"
    if not isinstance(target, dict | bool):
        return f"{value!r} resolves to something that is no schema"
    return None


def _subschemas(schema: Any, path: str, resolver: Any) -> list[tuple[str, dict[str, Any]]]:
    """(path, object) of every subschema validation can apply: keyword by keyword and
    through every local reference, so a `$ref` under a property named `enum` is found, and
    `enum`'s own values are not taken for schemas."""
    where: dict[int, str] = {}
    pending: list[tuple[Any, str]] = [(schema, path)]
    while pending:  # the path of every object in the document, for references' targets
        node, at = pending.pop()
        if isinstance(node, dict):
            where.setdefault(id(node), at)
            pending.extend((value, f"{at}.{key}") for key, value in node.items())
        elif isinstance(node, list):
            pending.extend((item, f"{at}[{n}]") for n, item in enumerate(node))
    found: list[tuple[str, dict[str, Any]]] = []
    seen: set[int] = set()
    schemas: list[Any] = [schema]
    while schemas:
        node = schemas.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        found.append((where[id(node)], node))
        schemas.extend(node.get(keyword) for keyword in _SCHEMA)
        for keyword in _SCHEMA_LISTS:
            if isinstance(node.get(keyword), list):
                schemas.extend(node[keyword])
        for keyword in _SCHEMA_MAPS:
            if isinstance(node.get(keyword), dict):
                schemas.extend(node[keyword].values())
        for keyword in _REF_KEYWORDS:
            ref = node.get(keyword)
            if isinstance(ref, str) and _reference_problem(ref, resolver) is None:
                schemas.append(resolver.lookup(ref).contents)
    return found


def _ref_loops(nodes: list[tuple[str, dict[str, Any]]], resolver: Any) -> list[dict[str, str]]:
    """Each $ref/$dynamicRef on a cycle of references and in-place applicators (a schema
    that applies itself to the same value without end)."""
    where = {id(node): at for at, node in nodes}
    by_id = {id(node): node for _, node in nodes}

    def edges(node: dict[str, Any]) -> Iterator[tuple[Any, str | None]]:
        for keyword in _REF_KEYWORDS:
            if isinstance(node.get(keyword), str):
                yield resolver.lookup(node[keyword]).contents, keyword
        for keyword in _IN_PLACE_LISTS:
            if isinstance(node.get(keyword), list):
                yield from ((item, None) for item in node[keyword])
        for keyword in _IN_PLACE:
            yield node.get(keyword), None
        if isinstance(node.get("dependentSchemas"), dict):
            yield from ((item, None) for item in node["dependentSchemas"].values())

    found: dict[str, dict[str, str]] = {}
    done: set[int] = set()
    for start in by_id:
        if start in done:
            continue
        stack: list[tuple[int, Iterator[tuple[Any, str | None]], str | None]] = [
            (start, iter(edges(by_id[start])), None)
        ]
        on_stack = {start: 0}
        while stack:
            current, successors, _ = stack[-1]
            step = next(successors, None)
            if step is None:
                stack.pop()
                on_stack.pop(current)
                done.add(current)
                continue
            child, keyword = step
            if not isinstance(child, dict) or id(child) in done:
                continue
            if id(child) in on_stack:
                # Each edge of the cycle: the node it leaves and the keyword it took.
                first = on_stack[id(child)]
                cycle = [(current, keyword)] + [
                    (stack[n - 1][0], stack[n][2]) for n in range(first + 1, len(stack))
                ]
                for node, via in cycle:
                    if via is not None:
                        at = f"{where[node]}.{via}"
                        found[at] = {"path": at, "message": _LOOP}
                continue
            on_stack[id(child)] = len(stack)
            stack.append((id(child), iter(edges(child)), keyword))
    return list(found.values())


_LOOP = "a reference loop that applies the schema to the same value without end"


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> Any:
    """The RE2 program of a pattern, or None when RE2 cannot run it."""
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error:
        return None


def _search(pattern: str, text: str) -> bool:
    """RE2's search, one evaluation of the check's budget per started kilobyte of text:
    RE2 is linear in the text, so the budget bounds what all searches scan together
    (200 patterns over 1,000 long property names would otherwise be millions of scans)."""
    _spend(1 + len(text) // 1024)
    compiled = _compiled(pattern)
    if compiled is None:  # published before patterns were checked: match nothing
        return False
    return compiled.search(text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError("does not match the pattern")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if _search(pattern, name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


_ADDITIONAL = Draft202012Validator.VALIDATORS["additionalProperties"]


def _additional_properties(validator: Any, aP: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """jsonschema's, except that the properties patternProperties covers are found by RE2."""
    patterns = schema.get("patternProperties")
    if not patterns or not validator.is_type(instance, "object"):
        yield from _ADDITIONAL(validator, aP, instance, schema)
        return
    known = schema.get("properties", {})
    extras = [
        name
        for name in instance
        if name not in known and not any(_search(p, name) for p in patterns)
    ]
    if validator.is_type(aP, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], aP, path=extra)
    elif not aP and extras:
        yield ValidationError("additional properties are not allowed")


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """jsonschema's, in linear time: its own compares every pair of items that Python
    cannot sort together (["x", 0, 1, ...]: 50 million comparisons in a 60 KB body).
    Each item is hashed in a form equal for JSON-equal values, and the walk is paid for,
    one evaluation per _WALK_PER_EVALUATION values (docs/reference/input-schema.md)."""
    if not unique or not validator.is_type(instance, "array"):
        return
    walked = [0]
    seen = set()
    for item in instance:
        form = _json_form(item, walked)
        if form in seen:
            yield ValidationError("has non-unique elements")
            break
        seen.add(form)
    _spend(walked[0] // _WALK_PER_EVALUATION)


def _multiple_of(validator: Any, divisor: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """jsonschema's, but an integer too large for a float is divided exactly: its own
    divides it as a float, an OverflowError (a 500) past 309 digits, and any storable
    integer may have 4 300 (flowforge.domain.jsonvalues). Below that, jsonschema's float
    quotient is kept (`multipleOf: 0.01` takes 5, which exact arithmetic would not)."""
    if isinstance(divisor, float) and validator.is_type(instance, "integer"):
        try:
            float(instance)
        except OverflowError:
            if (Fraction(instance) / Fraction(divisor)).denominator != 1:
                yield ValidationError("is not a multiple")
            return
    yield from _MULTIPLE_OF(validator, divisor, instance, schema)


_MULTIPLE_OF = Draft202012Validator.VALIDATORS["multipleOf"]


def _enum(validator: Any, members: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """jsonschema's, looked up rather than scanned: its own compares the value with every
    member in turn, and a definition holds 18 000 object members (30 ms a value, minutes a
    body). The value's hash walk is paid for like uniqueItems'."""
    walked = [0]
    form = _json_form(instance, walked)
    _spend(walked[0] // _WALK_PER_EVALUATION)
    if form not in _member_forms(members):
        yield ValidationError("is not one of the values")


# The members of the enums checked lately, each by the identity of the schema's list; the
# list is kept with its forms, so its id cannot be another list's while it is cached.
_ENUMS: OrderedDict[int, tuple[list[Any], frozenset[Any]]] = OrderedDict()
_ENUMS_LOCK = threading.Lock()
_ENUMS_KEPT = 4096


def _member_forms(members: list[Any]) -> frozenset[Any]:
    """The forms of an enum's members, built once per process and paid for by the check
    that builds them (a schema with more enums than are kept pays again, never more)."""
    with _ENUMS_LOCK:
        kept = _ENUMS.get(id(members))
        if kept is not None and kept[0] is members:
            _ENUMS.move_to_end(id(members))
            return kept[1]
    walked = [0]
    forms = frozenset(_json_form(member, walked) for member in members)
    _spend(walked[0] // _WALK_PER_EVALUATION)
    with _ENUMS_LOCK:
        _ENUMS[id(members)] = (members, forms)
        while len(_ENUMS) > _ENUMS_KEPT:
            _ENUMS.popitem(last=False)
    return forms


# Values a hash walk (uniqueItems) visits for one keyword evaluation: a visit is a
# fraction of a microsecond, an evaluation tens (tests/bench/schema_bounds.py).
_WALK_PER_EVALUATION = 10


def _json_form(value: Any, walked: list[int]) -> Any:
    """A hashable form of a JSON value, equal exactly when JSON Schema calls two values
    equal: numbers by value (1 and 1.0 are one), booleans apart from numbers, objects
    whatever their member order. Nesting is bounded by jsonvalues.MAX_DEPTH."""
    walked[0] += 1
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, list):
        return ("a", tuple(_json_form(item, walked) for item in value))
    if isinstance(value, dict):
        return ("o", frozenset((name, _json_form(item, walked)) for name, item in value.items()))
    return ("s", value)  # a string or null


_budget: contextvars.ContextVar[list[int]] = contextvars.ContextVar("schema_budget")


def _counted(keyword: Callable[..., Any], cost: int = 1) -> Callable[..., Any]:
    """A keyword that spends `cost` evaluations of the current check's budget, one more
    per _NAMES_PER_EVALUATION entries of its value it goes through (`required`'s names,
    `properties`' members) and one per error it makes: an applicator (`anyOf`, `not`)
    collects every error of a branch it then drops, so 18 000 required names would make
    18 000 errors a value for the price of one evaluation (docs/reference/input-schema.md)."""

    def evaluate(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        sized = isinstance(value, list | dict) and keyword is not _enum
        _spend(cost + (len(value) // _NAMES_PER_EVALUATION if sized else 0))
        for error in keyword(validator, value, instance, schema) or ():
            _spend(1)
            yield error

    return evaluate


# Entries of a keyword's value (a name looked up in the body) one evaluation pays for: a
# lookup is tens of nanoseconds, an evaluation tens of microseconds.
_NAMES_PER_EVALUATION = 100


# What a reference costs in evaluations: jsonschema resolves it and builds a validator for
# its target each time, several times the work of any other keyword (measured by
# tests/bench/schema_bounds.py).
_REF_COST = 5


def _spend(evaluations: int) -> None:
    """Take evaluations from the current check's budget; InputTooCostly once it is spent."""
    left = _budget.get()
    left[0] -= evaluations
    if left[0] < 0:
        raise InputTooCostly(
            f"checking this body against the input schema needs more than {MAX_EVALUATIONS} "
            "keyword evaluations"
        )


_KEYWORDS = {
    **Draft202012Validator.VALIDATORS,
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
    "multipleOf": _multiple_of,
    "enum": _enum,
}
BoundedValidator = validators.extend(
    Draft202012Validator,
    {
        name: _counted(fn, _REF_COST if name in _REF_KEYWORDS else 1)
        for name, fn in _KEYWORDS.items()
    },
)


def validator(schema: Any) -> Draft202012Validator:
    """A validator for a schema `problems` accepted (built once per cached intake target):
    its patterns on RE2, its keywords counted against the check's budget."""
    return BoundedValidator(schema)


def check(checker: Draft202012Validator, body: Any) -> None:
    """Raise InputTooLarge or InputInvalid (with every error's path, up to MAX_ERRORS)
    unless the parsed webhook body satisfies the schema."""
    if _more_values_than(body, MAX_VALUES):
        raise InputTooLarge(
            f"a webhook checked against an input schema may hold at most {MAX_VALUES} JSON "
            "values (objects, arrays, members and items together)"
        )
    token = _budget.set([MAX_EVALUATIONS])
    try:
        errors = list(itertools.islice(checker.iter_errors(body), MAX_ERRORS + 1))
    finally:
        _budget.reset(token)
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
