"""Connection pools and the one place where psycopg errors become FlowForge errors."""

from __future__ import annotations

import logging
import math
import re
import select
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import psycopg.abc
import psycopg.adapt
import psycopg_pool

from flowforge.errors import DatabaseUnavailable

logger = logging.getLogger(__name__)

# Valid JSON that jsonb refuses: NUL characters and unpaired UTF-16 surrogates.
_NOT_IN_JSONB = re.compile("[\x00\ud800-\udfff]")


# Checking a connection with a query on every checkout costs a round trip (and a commit)
# per unit of work. Instead: an idle connection's socket is readable only when the server
# sent something — a termination notice, or EOF after a restart — so a zero-cost poll
# catches dead connections; one idle for longer than this is checked with a query too.
CHECK_IDLE_SECONDS = 30.0
_returned_at: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = (
    weakref.WeakKeyDictionary()
)
_returned_lock = threading.Lock()


def _stamp_return(conn: psycopg.Connection[Any]) -> None:
    with _returned_lock:
        _returned_at[conn] = time.monotonic()


def _check(conn: psycopg.Connection[Any]) -> None:
    with _returned_lock:
        returned = _returned_at.get(conn)
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable or returned is None or time.monotonic() - returned > CHECK_IDLE_SECONDS:
        psycopg_pool.ConnectionPool.check_connection(conn)


_TIMESTAMPTZ = psycopg.adapters.types["timestamptz"].oid
_exact_loader = psycopg.adapters.get_loader(_TIMESTAMPTZ, psycopg.pq.Format.TEXT)
assert _exact_loader is not None
_TimestamptzText: type[psycopg.abc.Loader] = _exact_loader
EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)


class InstantLoader(psycopg.adapt.Loader):
    """timestamptz → datetime, where PostgreSQL's wider range maps to datetime's ends.

    PostgreSQL holds 'infinity' and years up to 294276; Python's datetime only 1 to 9999.
    FlowForge never stores such an instant (delays are checked before they are saved), but
    a row written before that check, or by hand, must not make an execution unreadable:
    reading it as the nearest end keeps GET, cancel and recovery working.
    """

    def __init__(self, oid: int, context: psycopg.abc.AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._exact = _TimestamptzText(oid, context)

    def load(self, data: psycopg.abc.Buffer) -> datetime:
        try:
            moment: datetime = self._exact.load(data)
            return moment
        except psycopg.DataError:
            text = bytes(data)
            return EARLIEST if text.startswith(b"-") or text.endswith(b"BC") else LATEST


# Every connection of the process (pools, the relay's listener, the CLI) reads this way.
psycopg.adapters.register_loader("timestamptz", InstantLoader)


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
        check=_check,
        reset=_stamp_return,
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


def jsonb_storable(value: Any) -> bool:
    """Whether jsonb can hold a parsed JSON value: no NUL, lone surrogate or non-finite number
    anywhere, keys included. Iterative, since hostile nesting can be deep."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _NOT_IN_JSONB.search(item):
                return False
        elif isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, dict):
            if any(_NOT_IN_JSONB.search(key) for key in item):
                return False
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True
