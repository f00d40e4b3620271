"""SIGTERM and SIGINT as bin/worker takes them: the handler sets a plain flag and writes
one byte to a wake-up pipe, and nothing else.

Python runs a signal handler in the main thread between two bytecodes, whatever that
thread holds at that moment. A handler that takes a lock — `Event.set()`, a logging
call — deadlocks when the signal lands while the main thread holds that same lock (it
did, inside `stop.wait()`: the drain never started and only SIGKILL ended the process).
So the handler touches no lock; the main thread waits on the pipe and does the rest
(logs, sets `stop`) in ordinary code. A second signal exits at once with `os._exit`,
which takes no lock either; its one log line is written with `os.write`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
from types import FrameType

SECOND_SIGNAL = json.dumps({"level": "warning", "msg": "second signal: exiting now"}) + "\n"


class StopSignals:
    """The signals that ask the worker to stop, and a pipe the main thread waits on."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self.received: list[int] = []

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.handle)

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        """The handler: a flag and a byte on the pipe on the first signal, exit on the next."""
        if self.received:
            os.write(2, SECOND_SIGNAL.encode())
            os._exit(1)
        self.received.append(signum)
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, b"s")

    def wait(self, timeout: float) -> int | None:
        """Block up to `timeout` s; the first signal's number once one has arrived."""
        if not self.received:
            select.select([self._read], [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            os.read(self._read, 64)
        return self.received[0] if self.received else None
