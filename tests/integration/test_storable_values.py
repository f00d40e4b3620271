"""Whatever a request hands to PostgreSQL is storable, and loads back; anything else is a
4xx problem that creates nothing (docs/contract.md#storable-values: every value FlowForge stores it
can load again).

The property tests probe the edges of jsonb (numeric weight and scale, exponents, NUL,
lone surrogates, nesting) and of timestamptz, and insert every accepted value for real,
both as the webhook intake does (the raw text cast to jsonb) and as management endpoints
do (the parsed value re-serialised by psycopg); a refused value must be one PostgreSQL
refuses too, or one that could not be loaded back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from flowforge.domain.definitions import parse_until
from flowforge.domain.jsonvalues import MAX_DEPTH, NotStorable, loads_storable
from flowforge.store.catalog import is_key
from tests.support.definitions import OPEN
from tests.support.problems import assert_problem

SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# Where PostgreSQL's numeric changes its mind, and one step either side of each edge.
EDGE_EXPONENTS = [
    base + offset
    for base in (0, 308, 309, 16_383, 131_071, 1_073_741_823)
    for offset in (-2, -1, 0, 1)
    for base in (base, -base)
]


@pytest.fixture(scope="module")
def pg(pg_admin_url: str) -> Iterator[psycopg.Connection]:
    """One connection with private temporary tables (nothing shared is touched)."""
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute("CREATE TEMPORARY TABLE stored (raw jsonb, parsed jsonb)")
        conn.execute("CREATE TEMPORARY TABLE instants (at timestamptz)")
        yield conn


def stores_and_loads(pg: psycopg.Connection, text: str, value: Any) -> None:
    """Insert both ways, read both back through psycopg's loader (json.loads)."""
    pg.execute("TRUNCATE stored")
    pg.execute(
        "INSERT INTO stored VALUES (%(raw)s::jsonb, %(parsed)s)",
        {"raw": text, "parsed": Jsonb(value)},
    )
    pg.execute("SELECT raw, parsed FROM stored").fetchone()


def postgres_refuses(pg: psycopg.Connection, text: str) -> bool:
    """Whether the raw text cannot be stored as jsonb, or cannot be loaded back."""
    try:
        pg.execute("SELECT %(raw)s::jsonb", {"raw": text}).fetchone()
    except (psycopg.errors.DataError, ValueError):
        return True
    return False


def check(pg: psycopg.Connection, text: str) -> None:
    """The property: accepted ⇒ stored and loaded; refused ⇒ PostgreSQL or loading agrees."""
    try:
        value = loads_storable(text)
    except NotStorable:
        refused_by_python = False
        try:
            parsed = json.loads(text, object_pairs_hook=list)  # duplicates kept
            refused_by_python = any(
                isinstance(item, float) and not math.isfinite(item) for item in _leaves(parsed)
            )
        except ValueError:  # more than 4300 integer digits: could not be loaded back
            refused_by_python = True
        assert refused_by_python or postgres_refuses(pg, text), text[:200]
        return
    stores_and_loads(pg, text, value)


def _leaves(value: Any) -> Iterator[Any]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list | tuple):
            stack.extend(item)
        else:
            yield item


digits = st.text("0123456789", min_size=1, max_size=6)
long_digit_runs = st.sampled_from([1, 308, 4_299, 4_300, 4_301, 16_382, 16_383, 16_384]).flatmap(
    lambda n: st.sampled_from(["0", "1", "9"]).map(lambda d: d * n)
)
integer_parts = st.one_of(
    st.just("0"),
    st.builds(lambda head, tail: head + tail, st.sampled_from("123456789"), digits | st.just("")),
    st.sampled_from(["1", "9"]).flatmap(lambda d: long_digit_runs.map(lambda run: d + run)),
)
fractions = st.one_of(st.just(""), digits, long_digit_runs).map(lambda f: f".{f}" if f else "")
exponents = st.one_of(
    st.just(""),
    st.builds(
        lambda letter, sign, exp: f"{letter}{sign}{exp}",
        st.sampled_from("eE"),
        st.sampled_from(["", "+", "-"]),
        st.one_of(
            st.sampled_from([abs(e) for e in EDGE_EXPONENTS]).map(str),
            st.integers(0, 10**12).map(str),
            st.sampled_from(["00001", "000", "9" * 40]),
        ),
    ),
)
numbers = st.builds(
    lambda sign, integer, fraction, exponent: sign + integer + fraction + exponent,
    st.sampled_from(["", "-"]),
    integer_parts,
    fractions,
    exponents,
)
# Strings spelled as JSON escapes, so NUL and lone surrogates can be written at all.
escaped_strings = st.lists(
    st.one_of(
        st.characters(codec="utf-8", exclude_characters='"\\')
        .map(json.dumps)
        .map(lambda s: s[1:-1]),
        st.integers(0, 0xFFFF).map(lambda code: f"\\u{code:04x}"),
        st.sampled_from(["\\u0000", "\\ud800", "\\udfff", "\\ud83d\\ude00", "\\n", "\\/"]),
    ),
    max_size=6,
).map(lambda parts: '"' + "".join(parts) + '"')
json_texts = st.recursive(
    numbers | escaped_strings | st.sampled_from(["true", "false", "null"]),
    lambda children: st.one_of(
        st.lists(children, max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(st.tuples(escaped_strings, children), max_size=3).map(
            lambda pairs: "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"
        ),
    ),
    max_leaves=6,
)


@SETTINGS
@given(numbers)
def test_accepted_numbers_are_stored_and_refused_ones_are_unstorable(
    pg: psycopg.Connection, text: str
) -> None:
    check(pg, text)


@SETTINGS
@given(json_texts)
def test_accepted_json_is_stored_and_refused_json_is_unstorable(
    pg: psycopg.Connection, text: str
) -> None:
    check(pg, text)


@pytest.mark.parametrize(
    "text",
    [
        "1.7976931348623157e308",
        "-2.2250738585072014e-308",
        "0e1073741822",
        "0.0e131073",
        "1e-16383",
        "1.0e-16382",
        "0e-16383",
        "1" * 4_300,
        "1e308",
    ],
)
def test_numbers_at_the_edge_are_accepted_and_stored(pg: psycopg.Connection, text: str) -> None:
    stores_and_loads(pg, text, loads_storable(text))


INSTANT_OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))


@SETTINGS
@given(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59)),
    INSTANT_OFFSETS,
)
def test_accepted_instants_load_back_in_every_time_zone(
    pg: psycopg.Connection, moment: datetime, zone: timezone
) -> None:
    text = moment.replace(tzinfo=zone).isoformat()
    try:
        parsed = parse_until(text)
    except ValueError:
        return
    pg.execute("TRUNCATE instants")
    pg.execute("INSERT INTO instants VALUES (%(at)s)", {"at": parsed})
    for session_zone in ("Etc/GMT-14", "UTC", "Etc/GMT+12"):
        pg.execute(f"SET TIME ZONE '{session_zone}'")
        (loaded,) = pg.execute("SELECT at FROM instants").fetchone()
        assert loaded == parsed
    pg.execute("SET TIME ZONE 'UTC'")


workflow_keys = st.one_of(
    st.from_regex(r"[a-z0-9][a-z0-9_-]{0,63}", fullmatch=True),
    st.from_regex(r"[a-z0-9][a-z0-9_-]{0,63}", fullmatch=True).map(lambda key: key + "\n"),
    st.text(max_size=70),
)


@SETTINGS
@given(workflow_keys)
def test_accepted_workflow_keys_pass_the_database_check(db: psycopg.Connection, key: str) -> None:
    """The key pattern and the CHECK on workflows.key agree: what is_key accepts inserts."""
    if not is_key(key):
        return
    with db.transaction(force_rollback=True):
        db.execute("INSERT INTO workflows (key) VALUES (%s)", (key,))


# --- through the API: 400 (or 422) and nothing created ------------------------------------

UNSTORABLE_BODIES = [
    b'{"x": 0.' + b"1" * 20_000 + b"}",  # thousands of fraction digits
    b'{"x": 1e-16384}',
    b'{"x": 100e-16385}',
    b'{"x": 1e131072}',
    b'{"x": 0e1073741823}',
    b'{"x": 1e' + b"9" * 40 + b"}",
    b'{"x": [1, 2, ' + b"9" * 5_000 + b"]}",
    b'{"x": 1e400}',
]


def created(db: psycopg.Connection) -> dict[str, int]:
    return {
        table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        for table in ("executions", "idempotency_keys", "workflow_versions")
    }


@pytest.mark.parametrize("raw", UNSTORABLE_BODIES, ids=range(len(UNSTORABLE_BODIES)))
def test_json_beyond_jsonb_numbers_is_400_everywhere(
    open_client: Any, db: psycopg.Connection, raw: bytes
) -> None:
    before = created(db)
    hook = open_client.post("/hooks/open", data=raw, content_type="application/json")
    assert "numeric" in assert_problem(hook, 400)["detail"]
    signed = open_client.post(
        "/hooks/open",
        data=raw,
        content_type="application/json",
        headers={"Idempotency-Key": "k-1"},
    )
    assert_problem(signed, 400)
    definition = (
        json.dumps({**OPEN, "description": "x"}).encode()[:-1] + b', "extra": ' + raw + b"}"
    )
    published = open_client.post(
        "/api/v1/workflows/open/versions", data=definition, content_type="application/json"
    )
    assert_problem(published, 400)
    assert created(db) == before
    eid = open_client.post("/hooks/open", json={"x": 1}).get_json()["execution_id"]
    resolve = open_client.post(
        f"/api/v1/executions/{eid}/steps/shape/resolve",
        data=b'{"outcome": "succeeded", "output": ' + raw + b"}",
        content_type="application/json",
    )
    assert_problem(resolve, 400)


@pytest.mark.parametrize(
    "until", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "9999-12-31T00:00:00Z"]
)
def test_delays_until_instants_that_cannot_load_back_are_422(open_client: Any, until: str) -> None:
    definition = {**OPEN, "steps": [{"id": "wait", "type": "delay", "until": until}]}
    body = assert_problem(open_client.post("/api/v1/workflows/late/versions", json=definition), 422)
    assert body["errors"][0]["path"] == "$.steps[0].until"


@pytest.mark.parametrize(
    ("path", "method"),
    [
        (f"/api/v1/workflows/open/versions/{10**30}", "get"),
        (f"/api/v1/workflows/open/webhook-secrets/{10**30}", "delete"),
        ("/api/v1/executions?limit=" + "9" * 30, "get"),
        ("/api/v1/executions?cursor=" + "A" * 5000, "get"),
        ("/api/v1/executions?cursor=%00", "get"),
        ("/api/v1/executions?status=%00", "get"),
        ("/api/v1/executions/%00", "get"),
        ("/api/v1/executions/" + "0" * 32 + "%0A", "get"),
    ],
)
def test_out_of_range_identifiers_and_parameters_are_4xx(
    open_client: Any, path: str, method: str
) -> None:
    response = getattr(open_client, method)(path)
    assert response.status_code in (400, 404), response.get_data(as_text=True)
    assert_problem(response, response.status_code)


def test_edge_numbers_in_a_webhook_are_stored_and_load_back(
    open_client: Any, db: psycopg.Connection
) -> None:
    """Accepted means stored: the intake hands the raw text to jsonb, which keeps it exactly."""
    raw = b'{"x": 1e-16383, "y": 0e1073741822, "z": ' + b"7" * 4_300 + b"}"
    ok = open_client.post("/hooks/open", data=raw, content_type="application/json")
    assert ok.status_code == 202, ok.get_data(as_text=True)
    (stored,) = db.execute(
        "SELECT input FROM executions WHERE id = %s", (ok.get_json()["execution_id"],)
    ).fetchone()
    assert stored["z"] == int("7" * 4_300)
    assert stored["x"] == 0.0 and stored["y"] == 0


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_nesting_beyond_the_limit_is_400_at_intake_publish_and_resolve(
    open_client: Any, db: psycopg.Connection
) -> None:
    """Python's C json shares the recursion counter with the caller's stack: without one
    explicit limit, a value accepted here could fail to load again deeper in a request."""
    before = created(db)
    too_deep = nested(MAX_DEPTH + 1)
    hook = open_client.post("/hooks/open", data=too_deep, content_type="application/json")
    assert str(MAX_DEPTH) in assert_problem(hook, 400)["detail"]
    definition = json.dumps(OPEN).encode()[:-1] + b', "extra": ' + nested(MAX_DEPTH) + b"}"
    published = open_client.post(
        "/api/v1/workflows/open/versions", data=definition, content_type="application/json"
    )
    assert_problem(published, 400)
    assert created(db) == before
    eid = open_client.post("/hooks/open", json={"x": 1}).get_json()["execution_id"]
    path = f"/api/v1/executions/{eid}/steps/shape/resolve"
    output = b'{"outcome": "succeeded", "output": ' + nested(MAX_DEPTH) + b"}"
    assert_problem(open_client.post(path, data=output, content_type="application/json"), 400)
    with pytest.raises(NotStorable):
        loads_storable(too_deep.decode())


def test_nesting_at_the_limit_is_accepted_and_loads_back(
    open_client: Any, pg: psycopg.Connection
) -> None:
    at_limit = nested(MAX_DEPTH)
    hook = open_client.post("/hooks/open", data=at_limit, content_type="application/json")
    assert hook.status_code == 202, hook.get_data(as_text=True)
    eid = hook.get_json()["execution_id"]
    # The resolve body is parsed (the output one level below the limit): a 409/404 for a
    # step that is not unknown, never a 400 for the nesting.
    path = f"/api/v1/executions/{eid}/steps/shape/resolve"
    output = b'{"outcome": "succeeded", "output": ' + nested(MAX_DEPTH - 1) + b"}"
    resolved = open_client.post(path, data=output, content_type="application/json")
    assert resolved.status_code != 400, resolved.get_data(as_text=True)
    stores_and_loads(pg, at_limit.decode(), loads_storable(at_limit.decode()))
