"""Connection pools and the one place where psycopg errors become FlowForge errors."""

from __future__ import annotations

import logging
import os
import select
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import psycopg._queries
import psycopg.abc
import psycopg.adapt
import psycopg.conninfo
import psycopg.generators
import psycopg_pool
import psycopg_pool.base

from flowforge.errors import (
    DatabaseError,
    DatabaseExists,
    DatabaseFull,
    DatabaseUnavailable,
    SchemaMissing,
    StatementCancelled,
)
from flowforge.store.outbox import NOTIFY_OUTBOX

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


# psycopg splits a statement at its placeholders on every execute, unless the statement
# is at most this long (then its lru_cache remembers the split). runs.SAVE_RUN, run twice
# per http_request step (claim and checkpoint), is longer: its split was 9.5 % of a
# worker's CPU on a steady backlog of https steps (py-spy --gil, tests/bench/outbound.py).
# Every statement of FlowForge is a constant (never built from input), so the cache's
# 128 entries hold the same few statements for good.
psycopg._queries.MAX_CACHED_STATEMENT_LENGTH = max(
    psycopg._queries.MAX_CACHED_STATEMENT_LENGTH, 16_384
)

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
# psycopg_pool retries a lost connection with a back-off doubling from 1 s, uncapped, which
# after an outage would reach minutes. Giving an attempt up after this long restarts it at
# the next request.
RECONNECT_TIMEOUT_S = 10.0
# And the tries are ~1 s apart (±10 %), not 1, 2, 4 s: with the doubling, a process whose
# database came back just after a try kept answering 503 for up to 4 s while its
# neighbours served (one gunicorn worker of four, tests/faults/test_postgres_trouble.py).
# A try refused by a server that is down costs one connect(), so every process is back
# within about a second of its database.
psycopg_pool.base.AttemptWithBackoff.DELAY_BACKOFF = 1.0


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

    `application_name` names the connections in pg_stat_activity (so an operator can count
    each process's share of max_connections) unless the URL names them itself.

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
    # Behind a transaction-mode pooler the server session changes with each transaction,
    # so the timeouts cannot travel in the startup `options` (PgBouncer refuses them):
    # each transaction sets them for itself (SET_LOCAL_TIMEOUTS). None: set at start-up.
    local_timeout_ms: int | None = None

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

    @contextmanager
    def pipeline(self) -> Iterator[psycopg.Pipeline]:
        """psycopg's pipeline mode, as a SyncedPipeline: a round trip reaches the server
        whole, ending in its Sync, or not at all."""
        with self.lock:
            self._check_connection_ok()
            if self._pipeline is None:
                self._pipeline = SyncedPipeline(self)
        with super().pipeline() as pipeline:
            yield pipeline

    @contextmanager
    def transaction(
        self, savepoint_name: str | None = None, force_rollback: bool = False
    ) -> Iterator[psycopg.Transaction]:
        """psycopg's transaction, whose outermost level sets the local timeouts first."""
        outermost = self.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with super().transaction(savepoint_name, force_rollback) as tx:
            if outermost:
                set_local_timeouts(self)
            yield tx


# statement_timeout and idle_in_transaction_session_timeout for this transaction only.
SET_LOCAL_TIMEOUTS = """
SELECT set_config('statement_timeout', %(ms)s, true),
       set_config('idle_in_transaction_session_timeout', %(ms)s, true)
"""


def set_local_timeouts(conn: psycopg.Connection[Any]) -> None:
    """Inside a transaction just begun: its timeouts, when the connection's session cannot
    hold them (a pooler's). In a pipeline this costs no round trip."""
    ms = getattr(conn, "local_timeout_ms", None)
    if ms is not None:
        conn.execute(SET_LOCAL_TIMEOUTS, {"ms": str(ms)})


class SyncedPipeline(psycopg.Pipeline):
    """A pipeline that sends nothing until a Sync, and then everything in one write.

    Between a statement that reached the server and the next Sync the server counts the
    session as `active` (waiting for the client), where neither statement_timeout nor
    idle_in_transaction_session_timeout runs, and PostgreSQL 15 has no
    transaction_timeout: a client frozen (SIGSTOP, a VM pause) or partitioned right after
    psycopg flushed a write, or a read not yet fetched, kept its row and advisory locks
    until the server's TCP keepalive noticed — hours — and a third of random freezes of a
    busy worker did (issue 39). psycopg flushes every statement as it is executed; here the
    statements wait in the pipeline's queue until a Sync is queued (a fetch, `sync()`, the
    end of the pipeline), and then go out, Sync last, in one write. So at every moment the
    client can stop, the server has either received nothing of a round trip or all of it:
    it runs the statements and then sits `idle in transaction` (the timeout frees the
    locks) or, for a round trip ending in COMMIT, commits without the client
    (docs/contract.md#frozen-processes). It costs no round trip and saves a write per statement.

    (libpq itself writes out a round trip longer than 8 KB in 8 KB pieces while it builds
    it, from a loop in C that takes microseconds: the one moment left, for large batches.)
    """

    def __init__(self, conn: psycopg.Connection[Any], _no_lock: bool = False) -> None:
        super().__init__(conn, _no_lock)
        self._synced = False

    def _enqueue_sync(self) -> None:
        super()._enqueue_sync()
        self._synced = True

    def _communicate_gen(self) -> psycopg.abc.PQGen[None]:
        if not self._synced:
            return  # held until a Sync joins it
        self._synced = False
        while self.command_queue:  # into libpq's buffer, unsent
            self.command_queue.popleft()()
        yield from psycopg.generators.send(self.pgconn)

    def _fetch_gen(self, *, flush: bool) -> psycopg.abc.PQGen[None]:
        # A fetch of a result still held in the queue ends the round trip with a Sync
        # instead of the Flush psycopg would send.
        if flush and self.command_queue:
            self._enqueue_sync()
            yield from self._communicate_gen()
            flush = False
        yield from super()._fetch_gen(flush=flush)


def create_pool(
    url: str,
    *,
    max_size: int,
    name: str,
    min_size: int = 1,
    timeout_s: float = 15.0,
    pooler: bool = False,
) -> psycopg_pool.ConnectionPool:
    """Open an autocommit pool; units of work open their own explicit transactions.

    `timeout_s` bounds each statement and idle transaction on the server, a wait for a
    reply (plus REPLY_MARGIN_S) and a wait for a free connection. Its connections are
    named flowforge-`name` in pg_stat_activity. `pooler`: the URL is a transaction-mode
    pooler's (PgBouncer), so no statement is prepared on the server (the next transaction
    may run on another server session, where it does not exist) and the timeouts are set
    inside each transaction instead of at start-up.
    """

    def configure(conn: psycopg.Connection[Any]) -> None:
        if isinstance(conn, DeadlineConnection):
            conn.reply_timeout_s = timeout_s + REPLY_MARGIN_S
            if pooler:
                conn.local_timeout_ms = int(timeout_s * 1000)

    kwargs: dict[str, Any] = {"autocommit": True}
    if pooler:
        kwargs["prepare_threshold"] = None
    return psycopg_pool.ConnectionPool(
        conninfo(
            url,
            statement_timeout_s=None if pooler else timeout_s,
            application=f"flowforge-{name}",
        ),
        connection_class=DeadlineConnection,
        configure=configure,
        min_size=min_size,
        max_size=max_size,
        name=name,
        kwargs=kwargs,
        check=_check,
        timeout=timeout_s,
        reconnect_timeout=RECONNECT_TIMEOUT_S,
        open=False,
    )


BEGIN = "BEGIN"
COMMIT = "COMMIT"


@contextmanager
def pipelined_transaction(
    conn: psycopg.Connection[Any], then: str | Callable[[], str | None] | None = None
) -> Iterator[psycopg.Pipeline]:
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

    On a DeadlineConnection the pipeline is a SyncedPipeline: each round trip reaches
    the server whole, Sync last, so the server never waits for the client while it counts
    the session as `active` (no timeout runs there). A block that waits on something
    other than PostgreSQL (a broker) syncs first (`pipeline.sync()`), so that what it
    queued has run and the idle-in-transaction timeout bounds the wait.

    `then`, a statement without parameters, travels right after the COMMIT: it runs in a
    transaction of its own (the relay's NOTIFY, outbox.NOTIFY_IF_PENDING, out of the
    commit that holds row locks and waits for the disk), and not at all if COMMIT failed.
    A callable is asked at the end of the block: None sends nothing (a unit of work that
    knows it wrote no wake-up pays no transaction for a NOTIFY, issue 41)."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise psycopg.ProgrammingError("pipelined_transaction() needs an idle connection")
    try:
        with conn.pipeline() as pipeline:
            conn.execute(BEGIN)
            set_local_timeouts(conn)
            yield pipeline
            conn.execute(COMMIT)
            last = then() if callable(then) else then
            if last is not None:
                conn.execute(last)
    except BaseException:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        raise


# A transaction that holds a lock others queue for (a key's row or slot lock) commits
# without waiting for the disk, so the lock is free when the commit record is written, not
# when it is flushed; FLUSH_BARRIER follows on the same connection before anything leaves
# that depends on it: a transaction with a WAL record of its own, committed with the
# configured synchronous_commit, which PostgreSQL makes durable (and, with a synchronous
# standby, replicated) only together with all WAL written before it. A later holder of the
# lock commits after it in the WAL, so it is never durable without it.
COMMIT_WITHOUT_FLUSH = "SELECT set_config('synchronous_commit', 'off', true)"
FLUSH_BARRIER = "SELECT pg_logical_emit_message(true, 'flowforge', 'commit flushed')"


def notify_relay(conn: psycopg.Connection[Any]) -> None:
    """Wake the relays, after (never inside) the commit that wrote wake-ups.

    PostgreSQL serialises every committing transaction that notifies on one database-wide
    lock, taken before the commit's WAL flush and held until after the wait for a
    synchronous standby: a NOTIFY inside the intake's commit made API processes commit one
    at a time (issue 26). Sent alone, in autocommit, the notifying transaction writes no
    WAL, so it holds that lock for microseconds. If the process dies between the two, the
    relay's poll (relay.POLL_SECONDS) finds the rows anyway — and so it does when this
    fails: what was committed stays accepted."""
    try:
        conn.execute(NOTIFY_OUTBOX)
    except psycopg.Error as exc:
        logger.warning("relay not notified; its poll will find the wake-ups: %s", exc)


def one(cursor: psycopg.Cursor[Any]) -> Any:
    """The single row of a statement that always returns one (RETURNING, count(*))."""
    row = cursor.fetchone()
    if row is None:
        raise AssertionError("statement returned no row")
    return row


@contextmanager
def wrap_exceptions(*, every_error: bool = False) -> Iterator[None]:
    """Translate 'the database is gone' into DatabaseUnavailable; let real bugs surface.

    The one place psycopg's errors become FlowForge's. `every_error` is for the
    command-line tools (bin/migrate, the CLI, start-up checks), which report instead of
    crash: every other psycopg error too, as DatabaseError (SchemaMissing for a table that
    is not there, DatabaseExists for a database that is), each message whole."""
    try:
        yield
    except psycopg_pool.PoolTimeout as exc:
        raise DatabaseUnavailable("no database connection available") from exc
    except psycopg.errors.QueryCanceled as exc:
        raise StatementCancelled(_message(exc, every_error, "cancelled")) from exc
    except psycopg.errors.DiskFull as exc:
        raise DatabaseFull(_message(exc, every_error, "disk full")) from exc
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(_message(exc, every_error, "database error")) from exc
    except psycopg.Error as exc:
        if not every_error:
            raise
        if isinstance(exc, psycopg.errors.UndefinedTable):
            raise SchemaMissing(str(exc)) from exc
        if isinstance(exc, psycopg.errors.DuplicateDatabase):
            raise DatabaseExists(str(exc)) from exc
        raise DatabaseError(str(exc)) from exc


def _message(exc: psycopg.Error, whole: bool, default: str) -> str:
    """The error's first line (whole: all of it, as psycopg says it), or `default`."""
    if not str(exc):
        return default
    return str(exc) if whole else str(exc).splitlines()[0]
