"""One source per bound (docs/reference/http-api.md): /openapi.json reads every number it
states from the constant the code checks, so the two cannot drift apart.

flowforge/api/openapi.py and the modules it is written in (openapi_*.py) hold no number of
their own beyond 0, 1 and -1 (the ends of
ranges such as "from 1" or "-1 for before the first"); each bound the definition parser
and the API keep is a named constant that both the check and the document read.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from flowforge.api import openapi
from flowforge.domain import definitions, model
from flowforge.store import sources
from flowforge.usecases import reingest

# The document and the modules it is assembled from.
SOURCES = sorted(Path(openapi.__file__).parent.glob("openapi*.py"))
SCHEMAS = openapi.DOCUMENT["components"]["schemas"]
PATHS = openapi.DOCUMENT["paths"]


def _status_codes(tree: ast.AST) -> set[int]:
    """The ids of the constants that are HTTP status codes: the arguments of problem_answers,
    AUTHENTICATED and PROBLEM_TEXT's keys."""
    holders: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "problem_answers":
                holders += node.args
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "AUTHENTICATED":
                holders.append(node.value)
            elif node.targets[0].id == "PROBLEM_TEXT" and isinstance(node.value, ast.Dict):
                holders += [key for key in node.value.keys if key is not None]
    return {id(n) for holder in holders for n in ast.walk(holder) if isinstance(n, ast.Constant)}


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_the_document_writes_no_number_of_its_own(source: Path) -> None:
    tree = ast.parse(source.read_text())
    statuses = _status_codes(tree)
    numbers = [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
        and node.value not in (0, 1)
        and id(node) not in statuses
    ]
    assert numbers == []


def _at(document: Any, *keys: str | int) -> Any:
    for key in keys:
        document = document[key]
    return document


REQUEST = SCHEMAS["Request"]["properties"]
RETRY = SCHEMAS["Retry"]["properties"]
CONCURRENCY = SCHEMAS["Concurrency"]["properties"]
CIRCUIT = SCHEMAS["Limit"]["properties"]["circuit"]["properties"]
BULK = SCHEMAS["BulkReplayRequest"]["properties"]
LIST_PARAMETERS = {p["name"]: p["schema"] for p in PATHS["/api/v1/executions"]["get"]["parameters"]}
WEBHOOK_HEADERS = {h["name"]: h["schema"] for h in openapi.WEBHOOK_HEADERS}

# (where in the document, the constant it must equal): the bounds once written twice.
BOUNDS = [
    (SCHEMAS["DelayStep"]["properties"]["duration_s"]["maximum"], definitions.MAX_DELAY_S),
    (REQUEST["timeout_s"]["maximum"], definitions.MAX_REQUEST_TIMEOUT_S),
    (REQUEST["timeout_s"]["default"], definitions.DEFAULT_REQUEST_TIMEOUT_S),
    (RETRY["max_attempts"]["maximum"], definitions.MAX_ATTEMPTS),
    (RETRY["initial_interval_s"]["maximum"], definitions.MAX_INITIAL_INTERVAL_S),
    (RETRY["backoff_coefficient"]["minimum"], definitions.MIN_BACKOFF_COEFFICIENT),
    (RETRY["backoff_coefficient"]["maximum"], definitions.MAX_BACKOFF_COEFFICIENT),
    (RETRY["max_interval_s"]["maximum"], definitions.MAX_RETRY_INTERVAL_S),
    (CONCURRENCY["limit"]["maximum"], definitions.MAX_CONCURRENCY_LIMIT),
    (CONCURRENCY["max_queued"]["maximum"], definitions.MAX_QUEUED),
    (CIRCUIT["failures"]["maximum"], definitions.MAX_CIRCUIT_FAILURES),
    (
        _at(SCHEMAS, "SourceDefinition", "properties", "subscriptions", "maxItems"),
        sources.MAX_SUBSCRIPTIONS,
    ),
    (BULK["filter"]["properties"]["version"]["maximum"], model.MAX_VERSION),
    (BULK["filter"]["properties"]["error"]["maxLength"], model.MAX_ERROR_FILTER_CHARS),
    (BULK["limit"]["maximum"], model.MAX_PAGE),
    (SCHEMAS["ReingestRequest"]["properties"]["limit"]["maximum"], reingest.MAX_PER_REQUEST),
    (SCHEMAS["ReingestRequest"]["properties"]["after"]["maximum"], reingest.MAX_CURSOR),
    (LIST_PARAMETERS["limit"]["maximum"], model.MAX_PAGE),
    (LIST_PARAMETERS["limit"]["default"], model.DEFAULT_PAGE),
    (WEBHOOK_HEADERS["Idempotency-Key"]["maxLength"], model.MAX_IDEMPOTENCY_KEY),
]


@pytest.mark.parametrize(("stated", "constant"), BOUNDS)
def test_each_bound_is_the_constant_the_code_checks(stated: float, constant: float) -> None:
    assert stated == constant
