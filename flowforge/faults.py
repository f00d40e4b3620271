"""Named fault points: no-ops unless a test arms them, so tests can kill a real process
at an exact line.

FLOWFORGE_FAULTS="after_http_response=kill,after_checkpoint_commit=sleep:5" arms points;
actions are `kill` (SIGKILL this process), `sleep:SECONDS`, `raise` and `stop` (SIGSTOP
this whole process, the first time only: a freeze at an exact line, which the test ends
with SIGCONT). A point inside a
loop that checks a stop event passes it: its sleep then ends when the loop is told to
stop, as the work it stands in for would. They arm only beside FLOWFORGE_TEST_MODE=1: a
stray FLOWFORGE_FAULTS in a production environment file must not make the worker kill
itself. Settings.from_env refuses that combination at start-up, so the process says why
instead of silently ignoring it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping

logger = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """Raised by a fault point armed with `raise`."""


def _parse(text: str) -> dict[str, str]:
    armed = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, action = item.partition("=")
        armed[name.strip()] = action.strip() or "kill"
    return armed


def armed(env: Mapping[str, str]) -> dict[str, str]:
    """The fault points an environment arms: none at all outside test mode."""
    if env.get("FLOWFORGE_TEST_MODE") != "1":
        return {}
    return _parse(env.get("FLOWFORGE_FAULTS", ""))


_ARMED = armed(os.environ)
_stopped = threading.Event()


def hit(name: str, stop: threading.Event | None = None) -> None:
    """Trigger the fault armed at this point, if any; a sleep ends early once `stop` is set."""
    action = _ARMED.get(name)
    if action is None:
        return
    logger.warning("fault point reached", extra={"fault": name, "action": action})
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.startswith("sleep:"):
        seconds = float(action.removeprefix("sleep:"))
        if stop is None:
            time.sleep(seconds)
        else:
            stop.wait(seconds)
    elif action == "raise":
        raise InjectedFault(name)
    elif action == "stop" and not _stopped.is_set():
        _stopped.set()
        os.kill(os.getpid(), signal.SIGSTOP)
