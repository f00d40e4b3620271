"""The worker's parts run in the test's own process: a pool of its own, and the
executor with a step handled by hand, its wake-up named, with no broker and no
bin/worker."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg_pool

from flowforge.steps import netguard
from flowforge.store.db import create_pool
from flowforge.worker.executor import Executor


@contextmanager
def pool(database_url: str, name: str, max_size: int = 2) -> Iterator[psycopg_pool.ConnectionPool]:
    """The worker's own kind of pool (`name` shows in pg_stat_activity), open for the block."""
    made = create_pool(database_url, max_size=max_size, name=name)
    made.open(wait=True, timeout=10)
    try:
        yield made
    finally:
        made.close()


@contextmanager
def executor(
    database_url: str,
    name: str,
    worker_id: str = "worker-console",
    secret_bindings: dict[str, frozenset[str]] | None = None,
) -> Iterator[Executor]:
    """An Executor on its own small pool (`name`), sending to 127.0.0.1 only; the pool
    closes when the block ends."""
    with pool(database_url, name) as made:
        yield Executor(
            made,
            worker_id=worker_id,
            lease_s=10,
            allow=netguard.Allowlist.parse("127.0.0.1"),
            secret_bindings=secret_bindings or {},
        )
