"""The API's connection pool: one per gunicorn worker process, opened by create_app.

A request takes one connection from it, on first use, and keeps it in `flask.g` until
the request ends (the shape of the Flask tutorial's `get_db`): authentication, the scope
check and the work itself share it instead of checking out two to four connections.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from flask import Flask, current_app, g

from flowforge.db import wrap_exceptions

CHECKOUT_TIMEOUT_S = 5.0


@contextmanager
def connection() -> Iterator[psycopg.Connection]:
    """This request's autocommit connection; database outages surface as 503 problems."""
    with wrap_exceptions():
        if "db" not in g:
            g.db = current_app.extensions["flowforge.pool"].getconn(timeout=CHECKOUT_TIMEOUT_S)
        yield g.db


def _release(_error: BaseException | None = None) -> None:
    """Give the request's connection back; the pool discards it if it broke."""
    conn = g.pop("db", None)
    if conn is not None:
        current_app.extensions["flowforge.pool"].putconn(conn)


def install(app: Flask) -> None:
    """Return every request's connection when its app context ends, error or not."""
    app.teardown_appcontext(_release)
