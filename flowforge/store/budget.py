"""How many PostgreSQL connections each process may open, and a check at start-up that
they fit in the server's max_connections (issue 26).

Per process, at most:
- bin/api: gunicorn workers x FLOWFORGE_DB_POOL_SIZE. A sync worker serves one request at
  a time and a request holds one connection (api/pool.py), so the default pool is 1.
- bin/worker: its pool (FLOWFORGE_WORKER_POOL_SIZE) + the relay's LISTEN connection.
Behind a transaction-mode pooler (FLOWFORGE_DATABASE_POOLER) the pools count against the
pooler's own server pool instead; only the direct connections reach PostgreSQL.

`python -m flowforge.store.budget --api 3 --workers 3` prints the budget of a whole topology
and what the server allows.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

import psycopg

from flowforge.errors import ConfigError, DatabaseError, DatabaseUnavailable
from flowforge.store.config import Settings
from flowforge.store.db import conninfo, wrap_exceptions

logger = logging.getLogger(__name__)

# The relay's LISTEN connection, outside the pool.
WORKER_DIRECT = 1

# What ordinary roles may open: max_connections less the slots kept for superusers (and,
# from PostgreSQL 16, for pg_use_reserved_connections).
AVAILABLE = """
SELECT current_setting('max_connections')::int
       - current_setting('superuser_reserved_connections')::int
       - coalesce(current_setting('reserved_connections', true)::int, 0),
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')
"""


@dataclass(frozen=True)
class Budget:
    """The connections one process may open to PostgreSQL itself."""

    process: str
    connections: int
    detail: str


def api_budget(settings: Settings, gunicorn_workers: int) -> Budget:
    """bin/api with `gunicorn_workers` sync workers."""
    if settings.behind_pooler:
        return Budget("bin/api", 0, "pools through the pooler")
    return Budget(
        "bin/api",
        gunicorn_workers * settings.db_pool_size,
        f"{gunicorn_workers} gunicorn workers x FLOWFORGE_DB_POOL_SIZE {settings.db_pool_size}",
    )


def worker_budget(settings: Settings) -> Budget:
    """One bin/worker."""
    if settings.behind_pooler:
        return Budget("bin/worker", WORKER_DIRECT, "the relay's LISTEN (pool through the pooler)")
    pool = settings.worker_pool_size
    return Budget(
        "bin/worker",
        pool + WORKER_DIRECT,
        f"pool {pool} (FLOWFORGE_WORKER_POOL_SIZE) + {WORKER_DIRECT} LISTEN",
    )


def server_room(url: str) -> tuple[int, int] | None:
    """(connections ordinary roles may open, client connections open now), or None when
    the server cannot be asked (down: a process still starts and answers 503)."""
    try:
        with (
            wrap_exceptions(every_error=True),
            psycopg.connect(conninfo(url), autocommit=True) as conn,
        ):
            row = conn.execute(AVAILABLE).fetchone()
    except (DatabaseUnavailable, DatabaseError) as exc:
        logger.warning("connection budget not checked: %s", str(exc).strip().splitlines()[0])
        return None
    assert row is not None
    return int(row[0]), int(row[1])


def check(settings: Settings, budget: Budget) -> None:
    """Refuse to start a process that alone cannot fit in the server's connections; warn
    when it fits alone but not beside the connections open now. Logs the budget."""
    room = server_room(settings.direct_url)
    logger.info(
        "database connection budget",
        extra={"program": budget.process, "connections": budget.connections, "of": budget.detail},
    )
    if room is None:
        return
    available, open_now = room
    if budget.connections > available:
        raise ConfigError(
            f"{budget.process} may open {budget.connections} database connections "
            f"({budget.detail}) but the server allows {available} (max_connections less "
            "reserved): lower the pool sizes or raise max_connections (docs/howto/several-hosts.md)"
        )
    if open_now + budget.connections > available:
        logger.warning(
            "the database may run out of connections",
            extra={"open_now": open_now, "this_process": budget.connections, "allowed": available},
        )


def main(argv: list[str] | None = None) -> int:
    """Print a topology's budget against the server's max_connections."""
    parser = argparse.ArgumentParser(prog="python -m flowforge.store.budget", description=__doc__)
    parser.add_argument("--api", type=int, default=1, help="bin/api processes (hosts)")
    parser.add_argument("--gunicorn-workers", type=int, default=5, help="sync workers of each")
    parser.add_argument("--workers", type=int, default=1, help="bin/worker processes")
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"budget: {exc}", file=sys.stderr)
        return 2
    api, worker = api_budget(settings, args.gunicorn_workers), worker_budget(settings)
    total = args.api * api.connections + args.workers * worker.connections
    print(f"bin/api     {api.connections:4d} each x {args.api}  ({api.detail})")
    print(f"bin/worker  {worker.connections:4d} each x {args.workers}  ({worker.detail})")
    print(f"total       {total:4d}")
    room = server_room(settings.direct_url)
    if room is None:
        print("server      not reachable; nothing checked")
        return 0
    print(f"server      {room[0]:4d} allowed (max_connections less reserved), {room[1]} open now")
    return 0 if total <= room[0] else 1


if __name__ == "__main__":
    sys.exit(main())
