"""The worst case of one webhook body's check against an input schema, in this process.

    .venv/bin/python -m tests.bench.schema_bounds

docs/reference/input-schema.md quotes these figures. Each line is one adversarial shape at
the limits a sender and a publisher control: a catastrophic-backtracking pattern on RE2
(`pattern`, `patternProperties`, `propertyNames`) over a string as long as the body limit
allows, the same pattern on Python's re for scale (a few characters only: it doubles per
character), a schema that doubles its work per level until the evaluation budget stops
it, and MAX_VALUES values under an ordinary schema (what the budget must leave room for).
A figure, not a test: nothing is asserted.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from flowforge.domain import inputschema
from flowforge.store.config import Settings

EVIL = r"^(\w+\s?)*$"


def timed(check: Callable[[], Any]) -> tuple[float, str]:
    started = time.perf_counter()
    try:
        check()
        outcome = "valid"
    except inputschema.InputTooCostly:
        outcome = "422 budget"
    except inputschema.InputInvalid:
        outcome = "422 invalid"
    return time.perf_counter() - started, outcome


def body_check(schema: Any, body: Any) -> Callable[[], None]:
    assert not inputschema.problems(schema, "$")
    checker = inputschema.validator(schema)
    return lambda: inputschema.check(checker, body)


def fan_out(levels: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"l{levels}": {"type": "integer"}}
    for n in range(levels):
        nxt = {"$ref": f"#/$defs/l{n + 1}"}
        defs[f"l{n}"] = {"anyOf": [nxt, {"allOf": [nxt]}]}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


def main() -> None:
    long = "a" * (Settings.max_body_bytes - 64) + "!"
    shapes = {
        f"pattern, {len(long):,} chars": body_check(
            {"properties": {"n": {"pattern": EVIL}}}, {"n": long}
        ),
        f"propertyNames, a {len(long):,}-char name": body_check(
            {"propertyNames": {"pattern": EVIL}}, {long: 1}
        ),
        "patternProperties x 200 patterns, 1,000 names of 500 chars": body_check(
            {"patternProperties": {f"^x{n}(\\w+\\s?)*$": True for n in range(200)},
             "additionalProperties": False},
            {f"{n:04d}" + "a" * 496 + "!": 1 for n in range(1000)},
        ),
        "fan-out schema, 40 levels (2^40 without the budget)": body_check(fan_out(40), "x"),
        f"{inputschema.MAX_VALUES:,} values, an ordinary schema": body_check(
            {"type": "array", "items": {"type": "object", "required": ["a"],
             "properties": {"a": {"type": "integer", "minimum": 0}}}},
            [{"a": n} for n in range(inputschema.MAX_VALUES // 2 - 1)],
        ),
    }  # fmt: skip
    for name, check in shapes.items():
        seconds, outcome = timed(check)
        print(f"{name}: {seconds * 1000:.1f} ms ({outcome})")
    for chars in (18, 20, 22):
        started = time.perf_counter()
        re.search(EVIL, "a" * chars + "!")
        print(f"python re, the same pattern, {chars} chars: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
