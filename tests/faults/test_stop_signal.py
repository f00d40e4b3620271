"""Issue 23 item 4: a SIGTERM always starts the drain.

The worker's signal handler used to call `stop.set()`. Python runs a handler in the main
thread between two bytecodes, so when SIGTERM landed while the main thread was inside
`stop.wait()` holding the Event's internal (non-reentrant) lock, `set()` waited for that
lock forever: the drain never started, a second signal blocked the same way, and only
SIGKILL ended the process. That window is a few microseconds every half second (a
randomized run hit it once); here the real bin/worker entry point is made to take the
signal exactly inside it, deterministically: its `Worker.run` holds the stop Event's lock
while SIGTERM is delivered, then supervises as usual. The handler must only set a flag
and write the wake-up pipe, so the process drains and exits 0.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import ROOT

HARNESS = """
import os, signal, sys
from flowforge.worker import main, supervisor

real_run = supervisor.Worker.run

def run_with_the_signal_inside_the_lock(self):
    with self.stop._cond:  # what Event.wait() holds around its wait
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # bytecodes: the handler runs here, with the lock held
            pass
    return real_run(self)

supervisor.Worker.run = run_with_the_signal_inside_the_lock
sys.exit(main.main())
"""


def test_sigterm_inside_the_stop_events_lock_still_drains(env: dict[str, str]) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", HARNESS],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("the worker deadlocked in its SIGTERM handler") from exc
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"draining"' in done.stderr
    assert '"worker stopped"' in done.stderr
