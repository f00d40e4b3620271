"""The API's connection pool: one per gunicorn worker process, opened by create_app."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from flask import current_app

from flowforge.db import wrap_exceptions


@contextmanager
def connection() -> Iterator[psycopg.Connection]:
    """A pooled autocommit connection; database outages surface as 503 problems."""
    pool = current_app.extensions["flowforge.pool"]
    with wrap_exceptions(), pool.connection(timeout=5.0) as conn:
        yield conn
