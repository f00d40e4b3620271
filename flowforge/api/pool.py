"""The API's connection pool: one per gunicorn worker process, opened by create_app.

A request takes one connection from it, on first use, and keeps it in `flask.g` until
the request ends (the shape of the Flask tutorial's `get_db`): authentication, the scope
check and the work itself share it instead of checking out two to four connections.

While the pool knows the database is down (the last request that needed it failed to
reach it, and none has reached it since), a request waits at most FAIL_FAST_S for a
connection instead of CHECKOUT_TIMEOUT_S: each sync worker is then free again at once,
so webhooks do not pile up behind 5 s waits for a 503. The pool keeps reconnecting in
the background; the first request that gets a connection ends the outage.

A silent database is worse: behind PgBouncer, or across a partition, a connection is
handed out (or a connect hangs) and the request waits for the reply deadline (the
statement timeout plus REPLY_MARGIN_S) — with five sync workers, 0.5 webhooks/s during a
cut. So after one request failed that slowly, the process answers 503 at once, touching
no connection, and a background thread probes the database (connect and SELECT 1, each
within PROBE_TIMEOUT_S, as the requests would reach it); the first probe answered ends
the silence. Should the probe thread itself get stuck, the silence lapses after
SILENT_HOLD_S and requests try again (docs/reference/http-api.md: 503 and Retry-After).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import psycopg_pool
from flask import Flask, current_app, g

from flowforge.errors import DatabaseUnavailable
from flowforge.store.db import DeadlineConnection, wrap_exceptions

logger = logging.getLogger(__name__)

CHECKOUT_TIMEOUT_S = 5.0
FAIL_FAST_S = 0.25
# A failure that took this long was a timeout (a silent database), not a refusal.
SLOW_FAILURE_S = 1.0
# How long one slow failure, or one failed probe, makes the process answer 503 at once.
SILENT_HOLD_S = 3.0
PROBE_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 0.5


class Outage:
    """Whether this process's last attempt to reach the database failed."""

    def __init__(self) -> None:
        self._down = threading.Event()
        self._lock = threading.Lock()
        self._silent_until = 0.0
        self._probing = False

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

    def silent(self) -> bool:
        """Whether the database was found silent a moment ago and not heard since."""
        return time.monotonic() < self._silent_until

    def went_silent(self, probe: Callable[[], None]) -> None:
        """A request waited out a timeout: answer 503 at once, and probe until `probe`
        returns (the database answers again)."""
        with self._lock:
            self._silent_until = time.monotonic() + SILENT_HOLD_S
            if self._probing:
                return
            self._probing = True
        logger.warning("database silent: answering 503 at once while probing it")
        threading.Thread(target=self._probe, args=(probe,), name="db-probe", daemon=True).start()

    def _probe(self, probe: Callable[[], None]) -> None:
        try:
            while True:
                time.sleep(PROBE_INTERVAL_S)
                try:
                    probe()
                except Exception as exc:  # any failure: still silent for this process
                    with self._lock:
                        self._silent_until = time.monotonic() + SILENT_HOLD_S
                    logger.debug("database probe failed: %s", exc)
                    continue
                logger.warning("database answers again")
                with self._lock:
                    self._silent_until = 0.0
                return
        finally:
            with self._lock:
                self._probing = False


def _prober(pool: psycopg_pool.ConnectionPool) -> Callable[[], None]:
    """Connect as the pool does (through the same URL, PgBouncer included) and SELECT 1,
    each within PROBE_TIMEOUT_S."""

    def probe() -> None:
        info = pool.conninfo
        with DeadlineConnection.connect(
            info() if callable(info) else info,
            connect_timeout=max(1, int(PROBE_TIMEOUT_S)),
            autocommit=True,
            prepare_threshold=None,
        ) as conn:
            conn.reply_timeout_s = PROBE_TIMEOUT_S
            conn.execute("SELECT 1")

    return probe


OUTAGE = Outage()


@contextmanager
def connection() -> Iterator[psycopg.Connection]:
    """This request's autocommit connection; database outages surface as 503 problems."""
    if OUTAGE.silent():
        raise DatabaseUnavailable("the database did not answer a moment ago; try again shortly")
    pool = current_app.extensions["flowforge.pool"]
    began = time.monotonic()
    try:
        with wrap_exceptions():
            if "db" not in g:
                g.db = pool.getconn(timeout=OUTAGE.checkout_timeout())
                OUTAGE.reached()
            yield g.db
    except DatabaseUnavailable:
        OUTAGE.failed()
        if time.monotonic() - began >= SLOW_FAILURE_S:
            OUTAGE.went_silent(_prober(pool))
        raise


def release_early() -> None:
    """Give the request's connection back before the request ends (a long poll between
    its reads: docs/contract.md#live-progress); the next connection() takes one again."""
    _release()


def _release(_error: BaseException | None = None) -> None:
    """Give the request's connection back; the pool discards it if it broke."""
    conn = g.pop("db", None)
    if conn is not None:
        current_app.extensions["flowforge.pool"].putconn(conn)


def install(app: Flask) -> None:
    """Return every request's connection when its app context ends, error or not."""
    app.teardown_appcontext(_release)
