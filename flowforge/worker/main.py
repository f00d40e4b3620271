"""bin/worker: one process, named threads, one stop event.

Shutdown order, on the first SIGTERM/SIGINT: the consumer stops taking messages; running
steps finish and checkpoint while the heartbeat keeps their leases alive and the
consumer keeps serving acks and AMQP heartbeats; then the relay, the timer scanner and
the reaper stop; pools close last. A second signal exits at once — whatever was running
is recovered by another worker's reaper when its lease runs out. A thread that dies
drains the worker the same way and exits non-zero (see `supervisor.py`).
"""

from __future__ import annotations

import logging
import os
import sys

from flowforge.logs import configure_logging
from flowforge.observe import tracing
from flowforge.store import budget
from flowforge.store.config import ConfigError, Settings
from flowforge.worker.supervisor import Worker

logger = logging.getLogger(__name__)


def main() -> int:
    """Run until told to stop; exit 0 after a clean drain, non-zero if a thread died."""
    configure_logging()
    worker = Worker(Settings.from_env())
    try:
        tracing.configure(os.environ, service="flowforge-worker")
        worker.serve_metrics()
        budget.check(worker.settings, budget.worker_budget(worker.settings))
    except (ConfigError, ValueError) as exc:
        logger.critical("%s", exc)
        return 2

    # The handlers only set a flag and wake the main thread (see signals.py).
    worker.signals.install()
    try:
        return worker.run()
    finally:
        tracing.shutdown()  # the spans still buffered leave with the drain


if __name__ == "__main__":
    sys.exit(main())
