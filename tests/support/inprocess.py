"""The worker's parts run in the test's own process: a pool of its own, the executor with
a step handled by hand, its wake-up named, and `InProcess`, a whole FlowForge driven that
way (the API app in-process, steps run as their wake-ups would run them), with no broker
and no bin/api or bin/worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg_pool

from flowforge.steps import netguard
from flowforge.store.db import create_pool
from flowforge.worker.broker import Wakeup
from flowforge.worker.executor import Executor
from flowforge.worker.timers import TimerScanner
from tests.support.api import Driver, webhook

T = TypeVar("T")


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
        yield loopback_executor(made, worker_id, secret_bindings=secret_bindings or {})


def loopback_executor(
    made: psycopg_pool.ConnectionPool, worker_id: str, lease_s: float = 10.0, **options: Any
) -> Executor:
    """An Executor on `made` that sends to 127.0.0.1 only (where every test target
    listens), with no secret bindings unless `options` give them."""
    options.setdefault("secret_bindings", {})
    return Executor(
        made,
        worker_id=worker_id,
        lease_s=lease_s,
        allow=netguard.Allowlist.parse("127.0.0.1"),
        **options,
    )


# What the relay would publish: the outbox's wake-ups, oldest first, taken out of it (the
# test's database is its own, so every row is this test's).
TAKE_WAKEUPS = """
DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 100)
RETURNING id, execution_id, step_id
"""


class Runner:
    """The worker's executor and timer scan, driven by hand: `until` hands the executor the
    outbox's wake-ups, oldest first, as the relay and the consumer would, and wakes due
    delays, back-offs, deadlines and expiries as the timer scanner does, one step at a
    time, until a condition holds."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.timers = TimerScanner(executor.pool, threading.Event())

    def until(self, done: Callable[[], T | None], timeout: float = 30.0, what: str = "") -> T:
        """Run what is woken until done() is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while not (value := done()):
            if time.monotonic() > deadline:
                raise AssertionError(f"never reached: {what or done}")
            with self.executor.pool.connection() as conn:
                wakeups = sorted(conn.execute(TAKE_WAKEUPS).fetchall())
            for _id, woken, step_id in wakeups:
                self.executor.handle(Wakeup(str(woken), step_id))
            if not wakeups:
                self.timers.scan()
                time.sleep(0.05)
        return value


class Answer:
    """The app's answer read as a `requests.Response` is (`status_code`, `headers`,
    `text`, `json()`), so a test reads the same against `Api` and `InProcess`."""

    def __init__(self, response: Any) -> None:
        self.status_code: int = response.status_code
        self.headers = response.headers
        self.text: str = response.get_data(as_text=True)
        self._json = response.get_json(silent=True)

    def json(self) -> Any:
        return self._json


class InProcess(Driver):
    """What a behaviour test needs of FlowForge, in its own process (dramatiq's stub
    worker, Temporal's testing/): the API app (`app_client`, signed in) and the worker's
    executor. `wait` hands the executor the outbox's wake-ups (the execution's, its
    children's, its map items'), as the relay and the consumer would, and wakes due
    delays and back-offs as the timer scanner does. Steps run one at a time: tests of
    concurrency, crashes and the broker keep real processes."""

    def __init__(self, app_client: Any, executor: Executor) -> None:
        self.app = app_client
        self.runner = Runner(executor)

    def publish(self, workflow: str, definition: dict[str, Any]) -> dict[str, Any]:
        r = self.app.post(f"/api/v1/workflows/{workflow}/versions", json=definition)
        assert r.status_code == 201, r.get_data(as_text=True)
        return dict(r.get_json())

    def hook(self, workflow: str, payload: Any, **sent: Any) -> Answer:
        """A webhook as `Api.hook` sends it (`headers`, `raw` as in `api.webhook`)."""
        body, headers = webhook(payload, **sent)
        return Answer(self.app.post(f"/hooks/{workflow}", data=body, headers=headers))

    def execution(self, execution_id: str) -> dict[str, Any]:
        r = self.app.get(f"/api/v1/executions/{execution_id}")
        assert r.status_code == 200, r.get_data(as_text=True)
        return dict(r.get_json())

    def text(self, path: str) -> str:
        """What a GET of `path` answers, as text (to search it, whatever its status)."""
        return str(self.app.get(path).get_data(as_text=True))

    def post(self, path: str, body: Any = None) -> Answer:
        """The app's answer to a POST, read as `Api.post`'s is."""
        return Answer(self.app.post(path, json=body))

    def delete(self, path: str) -> Answer:
        return Answer(self.app.delete(path))

    def until(self, condition: Callable[[], T | None], timeout: float, what: str) -> T:
        """Run what is woken until `condition` holds."""
        return self.runner.until(condition, timeout, what)
