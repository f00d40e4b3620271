"""/openapi.json as a contract a generated client can trust (docs/reference/http-api.md).

Schemathesis runs with every check (`--checks all`: answers inside their schemas and
status codes, schema-valid requests accepted, schema-violating ones refused, `Allow` true)
and its stateful phase, which follows the document's links from a publish to a webhook,
the execution it started and the operator actions on it. It runs as its CLI against the
live bin/api of tests/integration/test_fuzz_api.py (its own database and API key), only
ever at 127.0.0.1. The few rules a JSON Schema cannot state are written in the document
and named, with the operations that keep them, in tests/integration/schemathesis.toml.

Bounded for CI: EXAMPLES cases per operation and phase with a fixed seed (about a minute
on a quiet machine); raise FLOWFORGE_CONTRACT_EXAMPLES locally to search harder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import requests

from flowforge.api import openapi
from flowforge.api.paths import WorkflowKey
from tests.integration.test_fuzz_api import Live, _openapi_path
from tests.integration.test_fuzz_api import live as live  # the module's bin/api

EXAMPLES = int(os.environ.get("FLOWFORGE_CONTRACT_EXAMPLES", "25"))
CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMATHESIS = Path(sys.executable).with_name("st")
OPERATOR_EVENTS = (
    "execution.paused",
    "execution.cancel_requested",
    "execution.resumed",
    "execution.failed",
)


def test_schemathesis_with_every_check_and_its_stateful_phase_finds_nothing(
    live: Live, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            str(SCHEMATHESIS),
            "--config-file",
            str(CONFIG),
            "--no-color",
            "run",
            f"{live.base}/openapi.json",
            "--url",
            live.base,
            "--checks",
            "all",
            "--phases",
            "examples,coverage,fuzzing,stateful",
            "--header",
            live.headers["Authorization"].join(["Authorization: ", ""]),
            "--max-examples",
            str(EXAMPLES),
            "--seed",
            "43",
            # One worker: with more, CPython 3.11.7 fails ast.parse in schemathesis's coverage
            # phase ("AST constructor recursion depth mismatch"), an interpreter bug.
            "--workers",
            "1",
            "--generation-database",
            "none",
            # Lone surrogates are refused by a rule the document states in words (an ECMA-262
            # pattern cannot name one); UTF-8 strings leave them out of generated requests.
            "--generation-codec",
            "utf-8",
            "--request-timeout",
            "15",
            "--report",
            "json",
            "--report-json-path",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    # The stateful phase followed the links to an execution a webhook started and acted on
    # it: an operator action (pause, cancel, resume or fail) is in an execution's history.
    with psycopg.connect(live.database_url) as conn:
        acted = conn.execute(
            "SELECT count(*) FROM execution_events WHERE kind = ANY(%s)",
            (list(OPERATOR_EVENTS),),
        ).fetchone()
    assert acted is not None and acted[0] > 0, result.stdout[-5000:]


def test_every_route_is_documented_with_its_status_codes(live: Live) -> None:
    """Each Flask route is a documented operation and each documented operation a route;
    each lists the answers every such route gives: 401 and 503 behind an API key, 404
    with a path parameter, 400, 413, 415 and 422 with a JSON body."""
    from flowforge.api import create_app
    from flowforge.store.config import Settings

    app = create_app(Settings(database_url=live.database_url))
    try:
        routes = {
            (_openapi_path(rule.rule), method.lower()): rule
            for rule in app.url_map.iter_rules()
            if rule.endpoint != "static" and not rule.rule.startswith("/ui/")
            for method in rule.methods - {"HEAD", "OPTIONS"}
        }
    finally:
        app.extensions["flowforge.pool"].close(timeout=1)
    documented = {(path, method) for path, item in openapi.PATHS.items() for method in item}
    assert set(routes) == documented
    missing = {}
    for (path, method), rule in sorted(routes.items()):
        operation: dict[str, Any] = openapi.PATHS[path][method]
        needed = set()
        if operation.get("security") != []:
            needed |= {"401", "503"}
        for converter in rule._converters.values():
            # A path segment that is no identifier: 404, or 422 where publishing names it.
            publish = isinstance(converter, WorkflowKey) and converter.answer == "publish"
            needed.add("422" if publish else "404")
        if "requestBody" in operation:
            needed |= {"400", "413", "415"}
            if path.startswith("/api/"):
                needed.add("422")
        statuses = set(operation["responses"])
        if not statuses & {"200", "201", "202", "204"}:
            needed.add("a 2xx")
        if needed - statuses:
            missing[f"{method.upper()} {path}"] = sorted(needed - statuses)
    assert missing == {}


def test_get_on_the_bulk_replay_path_is_405_allowing_post(live: Live) -> None:
    """`replay` is no execution id: the path is POST /api/v1/executions/replay's."""
    for method in ("GET", "OPTIONS"):
        r = requests.request(
            method, f"{live.base}/api/v1/executions/replay", headers=live.headers, timeout=10
        )
        allowed = {m.strip() for m in r.headers["Allow"].split(",")}
        assert "GET" not in allowed and "POST" in allowed, (method, r.headers["Allow"])
    assert r.status_code == 200  # OPTIONS
    r = requests.get(f"{live.base}/api/v1/executions/replay", headers=live.headers, timeout=10)
    assert r.status_code == 405
    assert r.headers["Content-Type"] == "application/problem+json"


def test_null_is_refused_where_the_document_types_an_object(open_client: Any) -> None:
    """An optional field is left out, never null (schemathesis found each accepted)."""
    r = open_client.post(
        "/api/v1/workflows/open/reingest",
        json={"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "filter": None},
    )
    assert r.status_code == 422, r.get_json()
    assert r.get_json()["errors"][0]["path"] == "$.filter"
    r = open_client.post(
        "/api/v1/executions/replay",
        json={"filter": {"workflow": "open", "error": None}, "from_step": "a", "dry_run": True},
    )
    assert r.status_code == 422, r.get_json()
    assert r.get_json()["errors"][0]["path"] == "$.filter.error"
    limits = {"api": {"rate_per_s": 5, "circuit": None}}
    r = open_client.post(
        "/api/v1/workflows/limited/versions",
        json={
            "name": "l",
            "steps": [{"id": "a", "type": "transform", "output": {}}],
            "limits": limits,
        },
    )
    assert r.status_code == 422, r.get_json()
    assert "$.limits.api.circuit" in [e["path"] for e in r.get_json()["errors"]]


def test_a_whole_number_written_with_a_fraction_is_that_integer(open_client: Any) -> None:
    """JSON Schema's integer includes 1.0: a management body reads it as 1."""
    r = open_client.post(
        "/api/v1/executions/replay",
        json={"filter": {"workflow": "open", "version": 1.0}, "from_step": "a", "dry_run": True},
    )
    assert r.status_code == 200, r.get_json()
    r = open_client.post(
        "/api/v1/workflows/open/reingest",
        json={"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "limit": 10.0},
    )
    assert r.status_code == 200, r.get_json()
