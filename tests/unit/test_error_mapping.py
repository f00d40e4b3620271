"""Whose fault an error is decides its answer: a server fault is never called bad input.

The mapping is installed on a bare Flask app and each error raised from a route, so what
is checked is `problems.install` itself: every ClientError keeps its own 4xx, every
Unavailable is a 503, and anything else (a ConfigError, a MigrationError, a template the
worker could not render) is a logged 500 that tells the caller nothing about it.
"""

from __future__ import annotations

import logging

import pytest
from flask import Flask

from flowforge.api import problems
from flowforge.domain import definitions, jsonvalues
from flowforge.domain.templating import TemplateError
from flowforge.errors import (
    BrokerUnavailable,
    ClientError,
    ConfigError,
    Conflict,
    DatabaseError,
    DatabaseUnavailable,
    FlowForgeError,
    Forbidden,
    NotFound,
    SchemaMissing,
)
from flowforge.steps.netguard import SentNoResponse
from flowforge.store import timeline
from flowforge.store.migrate import MigrationError
from flowforge.trust import signatures
from flowforge.trust.sealing import EncryptionKeyMissing, SecretUnreadable
from tests.support.problems import assert_problem

SECRET_DETAIL = "postgresql://flowforge:hunter2@db.internal/flowforge"


def answer(error: Exception) -> object:
    app = Flask("errors")
    problems.install(app)

    @app.get("/boom")
    def boom() -> str:
        raise error

    return app.test_client().get("/boom")


@pytest.mark.parametrize(
    "error",
    [
        ConfigError(f"FLOWFORGE_DATABASE_URL {SECRET_DETAIL} is unusable"),
        MigrationError(f"0003_x.sql changed after it was applied to {SECRET_DETAIL}"),
        TemplateError(f"{{{{ input.x }}}}: 'x' not found in {SECRET_DETAIL}"),
        SentNoResponse(f"POST {SECRET_DETAIL}: connection reset"),
        FlowForgeError(SECRET_DETAIL),
        # psycopg's refusals as db.wrap_exceptions(every_error=True) says them: still ours.
        DatabaseError(f"syntax error at {SECRET_DETAIL}"),
        SchemaMissing(f'relation "workflows" does not exist at {SECRET_DETAIL}'),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_leaked_server_fault_is_a_logged_500_naming_nothing(
    error: FlowForgeError, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="flowforge.api.problems"):
        response = answer(error)
    body = assert_problem(response, 500)
    assert body["title"] == "Internal server error"
    assert SECRET_DETAIL not in response.get_data(as_text=True)
    assert any(record.exc_info and record.exc_info[1] is error for record in caplog.records)


@pytest.mark.parametrize("error", [DatabaseUnavailable("pool timeout"), BrokerUnavailable()])
def test_an_unreachable_dependency_is_a_503_worth_retrying(error: FlowForgeError) -> None:
    response = answer(error)
    body = assert_problem(response, 503)
    assert response.headers["Retry-After"] == "5"
    assert body["title"] == "Service unavailable"


@pytest.mark.parametrize("error", [EncryptionKeyMissing(), SecretUnreadable("secret 3")])
def test_a_fault_only_the_operator_can_fix_is_a_503_without_retry_after(
    error: FlowForgeError,
) -> None:
    response = answer(error)
    assert_problem(response, 503)
    assert "Retry-After" not in response.headers
    assert "secret 3" not in response.get_data(as_text=True)


@pytest.mark.parametrize(
    ("error", "status", "problem_type"),
    [
        (NotFound("no workflow 'x'"), 404, "not-found"),
        (Conflict("changed"), 409, "conflict"),
        (
            definitions.DefinitionInvalid([{"path": "$.steps", "message": "empty"}]),
            422,
            "invalid-definition",
        ),
        (jsonvalues.NotStorable("strings may not contain \\u0000"), 400, "unsupported-json"),
        (signatures.SignatureInvalid("no matching signature"), 401, "invalid-signature"),
        (timeline.BadCursor("pass back a next_cursor"), 400, "invalid-cursor"),
        (Forbidden("this API key may not read this workflow"), 403, "forbidden"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else None,
)
def test_a_client_error_keeps_its_own_status_and_type(
    error: ClientError, status: int, problem_type: str
) -> None:
    body = assert_problem(answer(error), status)
    assert body["type"] == f"urn:flowforge:problem:{problem_type}"
    assert body["detail"] == error.detail


def test_the_default_message_is_the_docstring() -> None:
    assert str(BrokerUnavailable()) == "RabbitMQ cannot be reached right now."
    assert str(EncryptionKeyMissing()).startswith("FLOWFORGE_ENCRYPTION_KEY (or the systemd")
