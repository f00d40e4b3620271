"""The Worker notices a service thread that died, against the real database and broker.

A service loop survives any Exception (`loop.py`); what ends a thread anyway must end
the process loudly, drained like on SIGTERM and with a non-zero status, so systemd
restarts it — never a worker that looks alive while it no longer wakes delays or
relays wake-ups.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import pytest

from flowforge.store.config import Settings
from flowforge.worker.loop import Loop
from flowforge.worker.supervisor import THREAD_DIED, Worker
from tests.support.processes import wait_for


class Counted(Loop):
    """A service that counts its passes, every 50 ms."""

    interval = 0.05

    def __init__(self, stop: threading.Event) -> None:
        super().__init__(type(self).__name__.lower(), stop)
        self.passes = 0


class Exits(Counted):
    """A service whose second pass ends its thread the way no error policy can catch."""

    def step(self) -> float:
        self.passes += 1
        if self.passes == 2:
            raise SystemExit("gone")
        return self.interval


class Crashes(Counted):
    """A service whose every pass raises: logged and retried, the thread lives on."""

    def step(self) -> float:
        self.passes += 1
        raise RuntimeError("a bug in one pass")


S = TypeVar("S", bound=Counted)


@contextmanager
def running(
    env: dict[str, str], caplog: pytest.LogCaptureFixture, kind: type[S]
) -> Iterator[tuple[Worker, S, threading.Thread, list[int]]]:
    """A real Worker with one more service of `kind`, running in a thread for the block
    with the worker's log captured; its exit status lands in the list."""
    worker = Worker(Settings.from_env(env))
    service = kind(worker.background)
    worker.services.append(service)
    statuses: list[int] = []
    runner = threading.Thread(target=lambda: statuses.append(worker.run()), daemon=True)
    with caplog.at_level(logging.INFO, logger="flowforge.worker"):
        runner.start()
        yield worker, service, runner, statuses


# The thread's death is the point; pytest's hook would report it as a stray warning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_service_thread_drains_the_worker_and_exits_non_zero(
    env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    with running(env, caplog, Exits) as (worker, _, runner, statuses):
        runner.join(timeout=30)
        worker.stop.set()  # only if it did not notice: lets a failing test end
    assert statuses == [THREAD_DIED]
    died = [r for r in caplog.records if "service thread died" in r.getMessage()]
    assert [(r.levelname, r.threads) for r in died] == [("CRITICAL", ["exits"])]  # type: ignore[attr-defined]
    assert not worker.consumer.is_alive()
    assert not any(service.is_alive() for service in worker.services)
    assert "worker stopped" in caplog.text


def test_a_pass_that_raises_is_logged_and_retried_without_ending_the_thread(
    env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    with running(env, caplog, Crashes) as (worker, crashes, runner, statuses):
        try:
            wait_for(lambda: crashes.passes >= 3, timeout=10, message="three failed passes")
            wait_for(worker.consumer.connected.is_set, timeout=10, message="consuming")
            assert crashes.is_alive()
        finally:
            worker.stop.set()
            runner.join(timeout=30)
    assert statuses == [0]
    crashed = [r for r in caplog.records if "crashes crashed" in r.getMessage()]
    assert len(crashed) >= 3 and all(r.exc_info for r in crashed)
