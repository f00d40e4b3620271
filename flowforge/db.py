"""Connection pools and the one place where psycopg errors become FlowForge errors."""

from __future__ import annotations

import logging
import os
import select
import sys
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
import psycopg.conninfo
import psycopg_pool

from flowforge.errors import DatabaseUnavailable

logger = logging.getLogger(__name__)

# Checking a connection with a query on every checkout costs a round trip (and a commit)
# per unit of work. Instead: an idle connection's socket is readable only when the server
# sent something — a termination notice, or EOF after a restart — so a zero-cost poll
# catches dead connections; one last handed out longer ago than this (so possibly idle
# that long) is checked with a query too. The time is taken at checkout, in the caller's
# thread: a pool `reset` callback to note returns would send every returned connection
# through one of the pool's worker threads, a thread hand-off per unit of work.
CHECK_IDLE_SECONDS = 30.0
_handed_out_at: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = (
    weakref.WeakKeyDictionary()
)
_handed_out_lock = threading.Lock()


def _check(conn: psycopg.Connection[Any]) -> None:
    with _handed_out_lock:
        last = _handed_out_at.get(conn)
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    now = time.monotonic()
    if readable or last is None or now - last > CHECK_IDLE_SECONDS:
        psycopg_pool.ConnectionPool.check_connection(conn)
    with _handed_out_lock:
        _handed_out_at[conn] = now


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


# Every connection: a dead peer or a cut link is noticed in seconds instead of the
# kernel's two hours. Keepalives catch it while the connection idles (after 10 s, then
# 3 probes 5 s apart); tcp_user_timeout while something we sent stays unacknowledged;
# connect_timeout while connecting. Values given in the URL win.
NETWORK_DEFAULTS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 20_000,
}
# How much longer than the server's statement timeout we wait for a reply before deciding
# that the server, or whatever sits between us, will never answer.
REPLY_MARGIN_S = 5.0
# After a database outage the pool's reconnect back-off (doubling from 1 s, uncapped) would
# reach minutes. Giving an attempt up after this long restarts it from 1 s at the next
# request, so attempts are never more than a few seconds apart.
RECONNECT_TIMEOUT_S = 10.0


# What each program's PostgreSQL connections are called (pg_stat_activity.application_name),
# so an operator can tell which process holds which connection.
APPLICATION_NAMES = {
    "api": "flowforge-api",
    "worker": "flowforge-worker",
    "migrate": "flowforge-migrate",
    "flowforge": "flowforge-cli",
}


def application_name() -> str:
    """The running program's name for PostgreSQL: `flowforge-api`, `flowforge-worker`..."""
    return APPLICATION_NAMES.get(os.path.basename(sys.argv[0]), "flowforge")


def conninfo(
    url: str, *, statement_timeout_s: float | None = None, application: str | None = None
) -> str:
    """The URL with FlowForge's network defaults, and server-side timeouts when asked.

    `statement_timeout_s` bounds both a statement and a transaction left idle, on the
    server, so a stuck peer can neither hold a row lock for long nor a statement forever.
    """
    params = psycopg.conninfo.conninfo_to_dict(url)
    for key, value in NETWORK_DEFAULTS.items():
        params.setdefault(key, value)
    if "PGAPPNAME" not in os.environ:  # an explicit name, in the URL or libpq's variable, wins
        params.setdefault("application_name", application or application_name())
    if statement_timeout_s is not None:
        ms = int(statement_timeout_s * 1000)
        timeouts = f"-c statement_timeout={ms} -c idle_in_transaction_session_timeout={ms}"
        given = params.get("options")
        params["options"] = f"{given} {timeouts}" if given else timeouts
    return psycopg.conninfo.make_conninfo("", **params)


class DeadlineConnection(psycopg.Connection[Any]):
    """A connection that stops waiting for a reply after `reply_timeout_s`.

    Keepalives cannot tell a partition from a peer that acknowledges bytes and never
    answers (a stopped server, a stuck proxy or NAT): without a deadline the thread waits
    forever. Past it the connection is closed — its protocol state is unknown — and the
    pool replaces it. Waits that set their own timeout (LISTEN) keep it.
    """

    reply_timeout_s: float = 30.0

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        limit = self.reply_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        try:
            return super().wait(gen, interval, limit)
        except psycopg.OperationalError:
            if timeout is None and not self.closed and time.monotonic() >= deadline:
                self.close()
                raise psycopg.OperationalError(
                    f"no reply from the database within {limit:g} s; connection closed"
                ) from None
            raise


def create_pool(
    url: str, *, max_size: int, name: str, min_size: int = 1, timeout_s: float = 15.0
) -> psycopg_pool.ConnectionPool:
    """Open an autocommit pool; units of work open their own explicit transactions.

    `timeout_s` bounds each statement and idle transaction on the server, a wait for a
    reply (plus REPLY_MARGIN_S) and a wait for a free connection.
    """

    def configure(conn: psycopg.Connection[Any]) -> None:
        if isinstance(conn, DeadlineConnection):
            conn.reply_timeout_s = timeout_s + REPLY_MARGIN_S

    return psycopg_pool.ConnectionPool(
        conninfo(url, statement_timeout_s=timeout_s, application=f"flowforge-{name}"),
        connection_class=DeadlineConnection,
        configure=configure,
        min_size=min_size,
        max_size=max_size,
        name=name,
        kwargs={"autocommit": True},
        check=_check,
        timeout=timeout_s,
        reconnect_timeout=RECONNECT_TIMEOUT_S,
        open=False,
    )


BEGIN = "BEGIN"
COMMIT = "COMMIT"


@contextmanager
def pipelined_transaction(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Pipeline]:
    """A transaction on an autocommit connection in which BEGIN travels with the first
    statements and COMMIT with the last ones: a unit of work that reads, then writes,
    costs two round trips. psycopg's own transaction() inside a pipeline costs five (it
    syncs after BEGIN so that it can tell a savepoint from a transaction, after the block,
    after COMMIT and on leaving the pipeline), which at a steady trickle of executions is
    most of a unit of work's latency. Not reentrant, and no transaction() inside it.

    Whatever goes wrong — an error in the block, a failed statement, a failed COMMIT —
    the transaction is rolled back before the error propagates (psycopg's rollback also
    forgets statements it prepared in the pipeline after the failure), so the connection
    goes back to its pool idle.

    Between two syncs the server counts the session as active, so neither
    statement_timeout nor idle_in_transaction_session_timeout runs: a block that waits on
    something other than PostgreSQL (a broker) syncs first (`pipeline.sync()`)."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise psycopg.ProgrammingError("pipelined_transaction() needs an idle connection")
    try:
        with conn.pipeline() as pipeline:
            conn.execute(BEGIN)
            yield pipeline
            conn.execute(COMMIT)
    except BaseException:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        raise


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
