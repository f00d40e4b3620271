"""bin/worker: one process, named threads, one stop event.

Shutdown order, on the first SIGTERM/SIGINT: the consumer stops taking messages; running
steps finish and checkpoint while the heartbeat keeps their leases alive and the
consumer keeps serving acks and AMQP heartbeats; then the relay, the timer scanner and
the reaper stop; pools close last. A second signal exits at once — whatever was running
is recovered by another worker's reaper when its lease runs out.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType

from flowforge import netguard, waits
from flowforge.config import Settings
from flowforge.db import conninfo, create_pool
from flowforge.logs import configure_logging
from flowforge.worker.broker import Topology, heartbeat_seconds
from flowforge.worker.consumer import Consumer
from flowforge.worker.executor import Executor
from flowforge.worker.leases import Heartbeat
from flowforge.worker.reaper import Reaper
from flowforge.worker.relay import Relay
from flowforge.worker.timers import TimerScanner

logger = logging.getLogger(__name__)


def main() -> int:
    """Run until told to stop; exit 0 after a clean drain."""
    configure_logging()
    settings = Settings.from_env()
    allow = netguard.Allowlist.parse(settings.http_allow)
    topology = Topology(settings.amqp_prefix)
    heartbeat_s = heartbeat_seconds(settings.amqp_url, settings.lease_seconds)
    # Executors hold a connection only inside a transaction, never across a request.
    pool = create_pool(
        settings.database_url,
        max_size=settings.worker_concurrency + 4,
        name="worker",
        min_size=2,
        timeout_s=settings.db_timeout_seconds,
    )
    pool.open(wait=False)

    stop = threading.Event()  # stops taking work
    background = threading.Event()  # stops the housekeeping threads, after the drain
    executor = Executor(
        pool,
        worker_id=settings.worker_id,
        lease_s=settings.lease_seconds,
        allow=allow,
        secret_bindings=settings.secret_bindings,
        resume=waits.ResumeUrls(settings.public_url, settings.resume_key),
    )
    consumer = Consumer(
        executor, settings.amqp_url, topology, settings.worker_concurrency, stop, heartbeat_s
    )
    others = [
        Relay(
            pool,
            conninfo(settings.database_url),
            settings.amqp_url,
            topology,
            background,
            heartbeat_s,
        ),
        TimerScanner(pool, background),
        Reaper(
            pool,
            lease_s=settings.lease_seconds,
            reconcile_s=settings.reconcile_seconds,
            stop=background,
        ),
        Heartbeat(pool, executor.leases, settings.worker_id, background),
    ]

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            logger.warning("second signal: exiting now")
            os._exit(1)
        logger.info("draining", extra={"signal": signal.Signals(signum).name})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    for thread in [*others, consumer]:
        thread.start()
    logger.info(
        "worker started",
        extra={
            "worker_id": settings.worker_id,
            "concurrency": settings.worker_concurrency,
            "prefix": settings.amqp_prefix,
            "amqp_heartbeat_s": heartbeat_s,
        },
    )
    while not stop.wait(0.5):
        pass
    consumer.join()
    consumer.join_pool()
    background.set()
    for thread in others:
        thread.join(timeout=10)
    pool.close()
    logger.info("worker stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
