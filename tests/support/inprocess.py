"""The worker's executor run in the test's own process: a step handled by hand, its
wake-up named, with no broker and no bin/worker."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from flowforge.steps import netguard
from flowforge.store.db import create_pool
from flowforge.worker.executor import Executor


@contextmanager
def executor(
    database_url: str,
    name: str,
    worker_id: str = "worker-console",
    secret_bindings: dict[str, frozenset[str]] | None = None,
) -> Iterator[Executor]:
    """An Executor on its own small pool (`name`), sending to 127.0.0.1 only; the pool
    closes when the block ends."""
    pool = create_pool(database_url, max_size=2, name=name)
    pool.open(wait=True, timeout=10)
    try:
        yield Executor(
            pool,
            worker_id=worker_id,
            lease_s=10,
            allow=netguard.Allowlist.parse("127.0.0.1"),
            secret_bindings=secret_bindings or {},
        )
    finally:
        pool.close()
