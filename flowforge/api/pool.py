"""The API's connection pool: one per gunicorn worker process, opened by create_app.

A request takes one connection from it, on first use, and keeps it in `flask.g` until
the request ends (the shape of the Flask tutorial's `get_db`): authentication, the scope
check and the work itself share it instead of checking out two to four connections.

While the pool knows the database is down (the last request that needed it failed to
reach it, and none has reached it since), a request waits at most FAIL_FAST_S for a
connection instead of CHECKOUT_TIMEOUT_S: each sync worker is then free again at once,
so webhooks do not pile up behind 5 s waits for a 503. The pool keeps reconnecting in
the background; the first request that gets a connection ends the outage.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from flask import Flask, current_app, g

from flowforge.errors import DatabaseUnavailable
from flowforge.store.db import wrap_exceptions

CHECKOUT_TIMEOUT_S = 5.0
FAIL_FAST_S = 0.25


class Outage:
    """Whether this process's last attempt to reach the database failed."""

    def __init__(self) -> None:
        self._down = threading.Event()

    @property
    def down(self) -> bool:
        return self._down.is_set()

    def checkout_timeout(self) -> float:
        """How long a request may wait for a connection now."""
        return FAIL_FAST_S if self._down.is_set() else CHECKOUT_TIMEOUT_S

    def failed(self) -> None:
        self._down.set()

    def reached(self) -> None:
        self._down.clear()


OUTAGE = Outage()


@contextmanager
def connection() -> Iterator[psycopg.Connection]:
    """This request's autocommit connection; database outages surface as 503 problems."""
    try:
        with wrap_exceptions():
            if "db" not in g:
                pool = current_app.extensions["flowforge.pool"]
                g.db = pool.getconn(timeout=OUTAGE.checkout_timeout())
                OUTAGE.reached()
            yield g.db
    except DatabaseUnavailable:
        OUTAGE.failed()
        raise


def _release(_error: BaseException | None = None) -> None:
    """Give the request's connection back; the pool discards it if it broke."""
    conn = g.pop("db", None)
    if conn is not None:
        current_app.extensions["flowforge.pool"].putconn(conn)


def install(app: Flask) -> None:
    """Return every request's connection when its app context ends, error or not."""
    app.teardown_appcontext(_release)
