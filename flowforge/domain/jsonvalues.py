"""JSON values as PostgreSQL's jsonb holds them: what it can store, and parsing that insists.

Pure Python, no database driver: the definition validator, the template engine, the
http_request step and the API body parser all judge values here, by one set of rules.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from flowforge.errors import ClientError

# Valid JSON that jsonb refuses: NUL characters and unpaired UTF-16 surrogates.
_NOT_IN_JSONB = re.compile("[\x00\ud800-\udfff]")
# jsonb numbers are PostgreSQL numerics: at most 131072 digits before the decimal point
# (the leading digit's base-10000 weight fits an int16) and 16383 after it (the display
# scale, counted from the number as written: 100e-16385 has scale 16385), and numeric_in
# refuses any exponent of magnitude INT_MAX / 2 or more before looking at the digits.
_NUMBER = re.compile(r"-?([0-9]+)(?:\.([0-9]+))?(?:[eE]([-+]?)([0-9]+))?")
NUMERIC_MAX_LEADING_POSITION = 131_071  # 10**131071 is the largest power of ten
NUMERIC_MAX_SCALE = 16_383
_NUMERIC_MAX_EXPONENT = 2_147_483_647 // 2
_UNSTORABLE_NUMBER = (
    "numbers must fit PostgreSQL's numeric type (at most 131072 digits before the decimal "
    "point and 16383 after it) and a 64-bit float; integers may have at most 4300 digits"
)

_UNSTORABLE_STRING = "strings may not contain \\u0000 or unpaired surrogates"

# Containers nested deeper than this are refused. Python 3.11's C json parser and encoder
# share the interpreter's recursion counter, so the depth they manage depends on how deep
# the caller's stack already is (about 990 levels from an idle thread, fewer inside a
# request): a value accepted in one place could fail to load in another. One explicit
# limit, far below that, makes every stored value load and dump again anywhere. 256 leaves
# room for the wrapping a value gets (a step output around a response body, an API answer
# around both) and for the definition validator's own, stricter, limit to be reported.
MAX_DEPTH = 256
_TOO_DEEP = f"JSON may nest at most {MAX_DEPTH} arrays and objects deep"


class NotStorable(ClientError):
    """Valid JSON that PostgreSQL cannot store, or that FlowForge could not load again."""

    title = "Unsupported JSON"


def numeric_storable(lexeme: str) -> bool:
    """Whether PostgreSQL's numeric input accepts a JSON number exactly as written.

    Mirrors numeric_in: the scale is the digits after the point minus the exponent, the
    weight is the position of the first non-zero digit; a zero has weight 0."""
    match = _NUMBER.fullmatch(lexeme)
    if match is None:
        return False
    integer, fraction, sign, exponent_digits = match.groups(default="")
    exponent_digits = exponent_digits.lstrip("0") or "0"
    if len(exponent_digits) > len(str(_NUMERIC_MAX_EXPONENT)):
        return False
    exponent = -int(exponent_digits) if sign == "-" else int(exponent_digits)
    if abs(exponent) >= _NUMERIC_MAX_EXPONENT:
        return False
    if len(fraction) - exponent > NUMERIC_MAX_SCALE:
        return False
    digits = integer + fraction
    first = len(digits) - len(digits.lstrip("0"))
    if first == len(digits):
        return True  # zero, whatever its exponent
    return len(integer) - 1 - first + exponent <= NUMERIC_MAX_LEADING_POSITION


def _storable_float(lexeme: str) -> float:
    value = float(lexeme)
    if not numeric_storable(lexeme) or not math.isfinite(value):
        raise NotStorable(_UNSTORABLE_NUMBER)
    return value


def _whole_as_int(lexeme: str) -> float | int:
    """A number written with a fraction or exponent that is a whole number, as an int:
    JSON Schema's integer is any number with a zero fractional part (761228.0 included)."""
    value = _storable_float(lexeme)
    return int(value) if value.is_integer() and abs(value) <= 2**53 else value


def _storable_int(lexeme: str) -> int:
    try:
        return int(lexeme)  # Python refuses more than 4300 digits: it could not load them
    except ValueError:
        raise NotStorable(_UNSTORABLE_NUMBER) from None


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Build an object, checking what a repeated key overwrites: jsonb parses the whole
    text, so a NUL in a value that Python's last-key-wins drops still fails the insert.
    Each overwritten value is checked once here; the kept ones by the final check."""
    value = dict(pairs)
    if len(value) != len(pairs):
        last = {key: index for index, (key, _) in enumerate(pairs)}
        dropped = [item for index, (key, item) in enumerate(pairs) if last[key] != index]
        if not jsonb_storable(dropped):
            raise NotStorable(_UNSTORABLE_STRING)
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_storable(text: str, *, whole_numbers_as_int: bool = False) -> Any:
    """Parse JSON text and insist that jsonb can store it and FlowForge can load it back.

    Numbers are judged by their text, as the webhook intake hands that text to jsonb; the
    parsed value is checked for NUL, lone surrogates and nesting beyond MAX_DEPTH. Raises
    ValueError for text that is not JSON (NaN and Infinity included) and NotStorable for
    valid JSON beyond what jsonb holds or FlowForge loads back, hostile nesting included.
    `whole_numbers_as_int` reads 2.0 as 2, for request parameters typed integer."""
    try:
        value = json.loads(
            text,
            parse_float=_whole_as_int if whole_numbers_as_int else _storable_float,
            parse_int=_storable_int,
            parse_constant=_no_constant,
            object_pairs_hook=_object,
        )
    except RecursionError:
        raise NotStorable(_TOO_DEEP) from None
    if not within_depth(value):
        raise NotStorable(_TOO_DEEP)
    if not jsonb_storable(value):
        raise NotStorable(_UNSTORABLE_STRING)
    return value


def storable_text(text: str) -> bool:
    """Whether PostgreSQL can store a string: no NUL, no unpaired surrogate."""
    return _NOT_IN_JSONB.search(text) is None


def jsonb_storable(value: Any) -> bool:
    """Whether jsonb can hold a parsed JSON value and FlowForge load it back anywhere: no NUL,
    lone surrogate or non-finite number anywhere, keys included, and no deeper than
    MAX_DEPTH. Iterative, since hostile nesting can be deep."""
    return within_depth(value) and _holds_only_storable(value)


def within_depth(value: Any) -> bool:
    """Whether no array or object lies more than MAX_DEPTH containers deep (`[]` is 1)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def _holds_only_storable(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _NOT_IN_JSONB.search(item):
                return False
        elif isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, dict):
            if any(_NOT_IN_JSONB.search(key) for key in item):
                return False
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def is_number(value: Any) -> bool:
    """Tell JSON numbers from booleans, which Python counts as ints but JSON does not."""
    return isinstance(value, int | float) and not isinstance(value, bool)
