"""The one shape of every service thread in bin/worker: a named loop of passes.

Each service (relay, consumer, reaper, timers, heartbeat) says only what one pass does
and how long to wait after it; the error policy is here, once: an outage of the database
or the broker is a warning and a back-off, anything else is a logged exception and a
back-off — never the silent end of a thread while the process still looks alive. What
escapes even that (a BaseException) ends the thread, and the `Worker` notices.
"""

from __future__ import annotations

import logging
import threading

from flowforge.errors import BrokerUnavailable, DatabaseUnavailable

logger = logging.getLogger(__name__)

# What a loop retries quietly: the dependency is away, not our code broken. pika's own
# errors never get here: a service that holds a broker connection runs its passes inside
# broker.broker_errors, which says them as BrokerUnavailable.
UNAVAILABLE: tuple[type[Exception], ...] = (DatabaseUnavailable, BrokerUnavailable)
# The warning for an outage; `dependency` is "database" or "broker".
OUTAGE = "%(dependency)s unavailable; %(name)s will retry"


class Loop(threading.Thread):
    """A service thread: `step()` repeated until `stop` is set, under one error policy."""

    #: Seconds between passes, unless `step()` says otherwise.
    interval: float = 1.0
    #: The warning logged when a pass meets an outage (see OUTAGE).
    outage_log: str = OUTAGE

    def __init__(self, name: str, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.stop = stop

    def step(self) -> float:
        """Do one pass; return how long to wait before the next one (0: go on at once)."""
        raise NotImplementedError

    def first_wait(self) -> float:
        """How long to wait before the first pass."""
        return 0.0

    def backoff(self, failures: int) -> float:
        """How long to wait after `failures` failed passes in a row."""
        return self.interval

    def idle(self, seconds: float) -> bool:
        """Wait between passes; True once the loop should stop. A service that holds a
        connection needing attention meanwhile (the relay's AMQP heartbeats) overrides it."""
        return self.stop.wait(seconds)

    def on_failure(self, error: Exception) -> None:
        """Drop whatever the failed pass may have left half-open (connections)."""

    def close(self) -> None:
        """Release what the loop holds, once it stopped."""

    def run(self) -> None:
        failures = 0
        pause = self.first_wait()
        try:
            while not self.idle(pause):
                try:
                    pause = self.step()
                    failures = 0
                except Exception as exc:
                    failures += 1
                    report(self.name, exc, failures, self.outage_log)
                    self.on_failure(exc)
                    pause = self.backoff(failures)
        finally:
            self.close()


def report(name: str, error: Exception, failures: int = 1, outage_log: str = OUTAGE) -> None:
    """Log a failed pass: an outage as a warning, anything else as an exception."""
    extra = {"service": name, "error": str(error)[:200] or type(error).__name__}
    if isinstance(error, UNAVAILABLE):
        dependency = "database" if isinstance(error, DatabaseUnavailable) else "broker"
        logger.warning(
            outage_log,
            {"dependency": dependency, "name": name},
            extra={**extra, "failures": failures, "kind": type(error).__name__},
        )
    else:
        logger.error("%s crashed; retrying", name, extra=extra, exc_info=error)
