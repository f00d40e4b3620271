"""One translation boundary per library: psycopg's errors become FlowForge's in
store/db.wrap_exceptions, pika's in worker/broker.broker_errors (tests/unit/test_architecture.py
checks nobody else catches them)."""

from __future__ import annotations

import psycopg
import psycopg_pool
import pytest
from pika.exceptions import StreamLostError

from flowforge.errors import (
    BrokerUnavailable,
    DatabaseError,
    DatabaseExists,
    DatabaseUnavailable,
    SchemaMissing,
    StatementCancelled,
)
from flowforge.store.db import wrap_exceptions
from flowforge.worker.broker import broker_errors

GONE = 'connection failed: FATAL:  database "nx" does not exist\nDETAIL: more'


@pytest.mark.parametrize(
    ("raised", "every_error", "expected", "message"),
    [
        (
            psycopg_pool.PoolTimeout("x"),
            False,
            DatabaseUnavailable,
            "no database connection available",
        ),
        (psycopg.errors.QueryCanceled("canceled\nmore"), False, StatementCancelled, "canceled"),
        (psycopg.OperationalError(GONE), False, DatabaseUnavailable, GONE.splitlines()[0]),
        # The command-line tools say psycopg's message whole.
        (psycopg.OperationalError(GONE), True, DatabaseUnavailable, GONE),
        (psycopg.errors.UndefinedTable("no workflows"), True, SchemaMissing, "no workflows"),
        (psycopg.errors.DuplicateDatabase("exists"), True, DatabaseExists, "exists"),
        (psycopg.ProgrammingError("bad conninfo"), True, DatabaseError, "bad conninfo"),
    ],
)
def test_psycopg_errors_become_flowforge_errors(
    raised: Exception, every_error: bool, expected: type[Exception], message: str
) -> None:
    with pytest.raises(expected) as caught, wrap_exceptions(every_error=every_error):
        raise raised
    assert type(caught.value) is expected and str(caught.value) == message
    assert caught.value.__cause__ is raised


def test_a_bug_surfaces_unless_every_error_is_asked_for() -> None:
    with pytest.raises(psycopg.errors.UndefinedTable), wrap_exceptions():
        raise psycopg.errors.UndefinedTable("no workflows")


@pytest.mark.parametrize(
    ("raised", "message"),
    [
        (StreamLostError("Transport indicated EOF"), "StreamLostError: Transport indicated EOF"),
        (ConnectionResetError(), "ConnectionResetError"),
    ],
)
def test_pika_errors_stop_in_the_broker_module(raised: Exception, message: str) -> None:
    with pytest.raises(BrokerUnavailable) as caught, broker_errors():
        raise raised
    assert str(caught.value) == message and caught.value.__cause__ is raised


def test_other_errors_pass_the_broker_boundary() -> None:
    with pytest.raises(KeyError), broker_errors():
        raise KeyError("a bug")
