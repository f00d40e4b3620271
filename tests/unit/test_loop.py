"""The one error policy of every service thread (`flowforge/worker/loop.py`)."""

from __future__ import annotations

import logging
import threading

import pytest

from flowforge.errors import BrokerUnavailable, DatabaseUnavailable
from flowforge.worker.loop import Loop


class Scripted(Loop):
    """Raises the scripted errors pass after pass, then stops the loop."""

    interval = 0.01

    def __init__(self, errors: list[Exception]) -> None:
        super().__init__("scripted", threading.Event())
        self.errors = errors
        self.failures_seen: list[Exception] = []
        self.closed = False

    def step(self) -> float:
        if not self.errors:
            self.stop.set()
            return 0.0
        raise self.errors.pop(0)

    def on_failure(self, error: Exception) -> None:
        self.failures_seen.append(error)

    def close(self) -> None:
        self.closed = True


def test_an_outage_is_a_warning_and_a_bug_a_logged_exception_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors: list[Exception] = [DatabaseUnavailable("db"), BrokerUnavailable("mq"), KeyError("x")]
    loop = Scripted(list(errors))
    with caplog.at_level(logging.WARNING, logger="flowforge.worker.loop"):
        loop.start()
        loop.join(timeout=10)
    assert not loop.is_alive() and loop.closed
    assert loop.failures_seen == errors
    assert [(r.levelname, r.getMessage(), bool(r.exc_info)) for r in caplog.records] == [
        ("WARNING", "database unavailable; scripted will retry", False),
        ("WARNING", "broker unavailable; scripted will retry", False),
        ("ERROR", "scripted crashed; retrying", True),
    ]
