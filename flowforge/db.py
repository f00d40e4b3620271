"""Connection pools and the one place where psycopg errors become FlowForge errors."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool

from flowforge.errors import DatabaseUnavailable

logger = logging.getLogger(__name__)


def create_pool(
    url: str, *, max_size: int, name: str, min_size: int = 1
) -> psycopg_pool.ConnectionPool:
    """Open an autocommit pool; units of work open their own explicit transactions."""
    return psycopg_pool.ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        name=name,
        kwargs={"autocommit": True},
        # A restarted server leaves dead sockets in the pool: check before handing out.
        check=psycopg_pool.ConnectionPool.check_connection,
        reconnect_timeout=3600,
        open=False,
    )


def one(cursor: psycopg.Cursor[Any]) -> Any:
    """The single row of a statement that always returns one (RETURNING, count(*))."""
    row = cursor.fetchone()
    if row is None:
        raise AssertionError("statement returned no row")
    return row


@contextmanager
def wrap_exceptions() -> Iterator[None]:
    """Translate 'the database is gone' into DatabaseUnavailable; let real bugs surface."""
    try:
        yield
    except psycopg_pool.PoolTimeout as exc:
        raise DatabaseUnavailable("no database connection available") from exc
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            str(exc).splitlines()[0] if str(exc) else "database error"
        ) from exc
