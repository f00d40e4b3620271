"""The Worker: owns the pools and every thread of bin/worker, starts them, stops them in
the documented order, and notices a thread that died.

Every service loop survives any Exception by its own error policy (`loop.py`), so a
dead thread means something that policy cannot handle — a BaseException, a bug in the
loop itself. Restarting it in place would hide that; the Worker drains like on SIGTERM
and returns a non-zero exit status, loudly logged, so systemd (Restart=always) starts a
fresh process — procrastinate's `_monitor_side_tasks` and dramatiq's worker do the same.

Shutdown order, once `stop` is set: the consumer stops taking messages; running steps
finish and checkpoint on the executor threads while the heartbeat keeps their leases
alive and the consumer keeps serving acks and AMQP heartbeats; then the relay, the timer
scanner, the scheduler, the reaper and housekeeping stop; pools close last.
"""

from __future__ import annotations

import errno
import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import start_http_server

from flowforge.errors import ConfigError
from flowforge.observe import metrics, tracing
from flowforge.steps import netguard
from flowforge.store import runs
from flowforge.store.config import Settings
from flowforge.store.db import conninfo, create_pool
from flowforge.trust import resume_tokens
from flowforge.usecases import intake
from flowforge.worker.broker import QueueHead, Topology, heartbeat_seconds
from flowforge.worker.consumer import Consumer
from flowforge.worker.executor import Executor
from flowforge.worker.housekeeping import Housekeeping
from flowforge.worker.leases import Heartbeat
from flowforge.worker.loop import Loop
from flowforge.worker.notifier import Notifier
from flowforge.worker.places import PlaceTimer
from flowforge.worker.reaper import Reaper
from flowforge.worker.relay import Relay
from flowforge.worker.scheduler import Scheduler
from flowforge.worker.signals import StopSignals
from flowforge.worker.timers import TimerScanner

logger = logging.getLogger(__name__)

# How often the Worker looks for a dead thread (and for `stop`).
MONITOR_SECONDS = 0.5
# How long each background service may take to stop after the drain.
JOIN_SECONDS = 10.0
# Exit status of a worker that stopped because one of its threads died.
THREAD_DIED = 1
# The background services' share of FLOWFORGE_WORKER_POOL_SIZE: each holds at most one
# connection at a time, and they are six; a third of the budget, one to three.
SERVICES_POOL = 3


def services_pool_size(worker_pool_size: int) -> int:
    """How many of the worker's pooled connections are the background services' own."""
    return max(1, min(SERVICES_POOL, worker_pool_size // 3))


class Worker:
    """One worker process's pools and threads, from start to the last pool closed."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # What each unit of work saved is counted and traced after its COMMIT.
        runs.listen(metrics.saved)
        runs.listen(tracing.saved)
        intake.listen_target_reads(metrics.INTAKE_TARGET_READS.inc)
        allow = netguard.Allowlist.parse(settings.http_allow)
        topology = Topology(settings.amqp_prefix, settings.amqp_queue_type)
        self.heartbeat_s = heartbeat_seconds(settings.amqp_url, settings.lease_seconds)
        # Executors hold a connection only inside a transaction (a claim, a checkpoint),
        # never across a request, so hundreds of them share a few connections: the
        # pool's size is its own setting, not the concurrency. The background services
        # get a share of that budget of their own (SERVICES_POOL): in one shared pool,
        # whose waiters are served first come first served, the relay that feeds the
        # executors and the heartbeat that keeps their leases queued behind hundreds of
        # executor threads — at concurrency 256 the executors sat idle for want of
        # wake-ups, and requests were kept home for want of a fresh liveness beat. The
        # relay's LISTEN connection is its own, outside both.
        services = services_pool_size(settings.worker_pool_size)
        pool_args: dict[str, Any] = {
            "timeout_s": settings.db_timeout_seconds,
            "pooler": settings.behind_pooler,
        }
        self.pool = create_pool(
            settings.database_url,
            max_size=settings.worker_pool_size - services,
            name="worker",
            min_size=min(2, settings.worker_pool_size - services),
            **pool_args,
        )
        self.services_pool = create_pool(
            settings.database_url,
            max_size=services,
            name="worker-services",
            min_size=1,
            **pool_args,
        )
        self.stop = threading.Event()  # stops taking work
        self.signals = StopSignals()  # SIGTERM/SIGINT, set by bin/worker's handlers
        self.background = threading.Event()  # stops the housekeeping threads, after the drain
        timers = TimerScanner(self.services_pool, self.background)
        places = PlaceTimer(
            lambda wakeup: self.executor_threads.submit(self.executor.handle, wakeup),
            taking_work=lambda: not self.stop.is_set(),
            stop=self.background,
        )
        self.executor = Executor(
            self.pool,
            worker_id=settings.worker_id,
            lease_s=settings.lease_seconds,
            ageing_s=settings.priority_ageing_s,
            allow=allow,
            secret_bindings=settings.secret_bindings,
            resume=resume_tokens.ResumeUrls(settings.public_url, settings.resume_key),
            host_limits=settings.host_limits,
            shared_limits=settings.shared_limits,
            wake_in=timers.wake_in,
            wake_at_place=places.add,
            stopping=self.stop,
            sync_unsafe_claims=settings.sync_unsafe_claims,
        )
        self.executor_threads = ThreadPoolExecutor(
            settings.worker_concurrency, thread_name_prefix="executor"
        )
        # How far the consumer got into the queue, for the reconciler (broker.QueueHead).
        self.queue_head = QueueHead()
        self.consumer = Consumer(
            self.executor,
            settings.amqp_url,
            topology,
            self.executor_threads,
            settings.worker_concurrency,
            self.stop,
            self.heartbeat_s,
            head=self.queue_head,
        )
        #: The services that stop after the drain, on `background`.
        self.services = self._background_services(settings, topology, allow, timers, places)
        self.metrics_server: Any = None

    def _background_services(
        self,
        settings: Settings,
        topology: Topology,
        allow: netguard.Allowlist,
        timers: TimerScanner,
        places: PlaceTimer,
    ) -> list[Loop]:
        """The threads beside the executors, on the services' pool: the relay, the timers,
        the scheduler, the reaper, housekeeping, the heartbeat and the notifier."""
        notifier = Notifier(
            self.services_pool,
            self.background,
            allow=allow,
            window_s=settings.notify_window_s,
            disable_after_s=settings.notify_disable_after_s,
            key=settings.notify_key,
        )
        return [
            Relay(
                self.services_pool,
                # LISTEN needs a session of its own: never through a transaction pooler.
                conninfo(settings.direct_url, application="flowforge-worker-relay"),
                settings.amqp_url,
                topology,
                self.background,
                self.heartbeat_s,
                run_pure=self.executor.run_pure,
                taking_work=lambda: not self.stop.is_set(),
                wake_notifier=notifier.wake,
            ),
            timers,
            places,
            Scheduler(self.services_pool, self.background),
            Reaper(
                self.services_pool,
                lease_s=settings.lease_seconds,
                reconcile_s=settings.reconcile_seconds,
                stop=self.background,
                head=self.queue_head,
            ),
            Housekeeping(
                self.services_pool, self.background, key_hours=settings.idempotency_key_hours
            ),
            Heartbeat(
                self.services_pool, self.executor.leases, settings.worker_id, self.background
            ),
            notifier,
        ]

    def run(self) -> int:
        """Start, supervise until `stop` or a dead thread, drain; return the exit status."""
        self.start()
        status = self.supervise()
        self.shutdown()
        return status

    def start(self) -> None:
        if self.metrics_server is None:
            self.serve_metrics()
        self.pool.open(wait=False)
        self.services_pool.open(wait=False)
        for thread in [*self.services, self.consumer]:
            thread.start()
        logger.info(
            "worker started",
            extra={
                "worker_id": self.settings.worker_id,
                "concurrency": self.settings.worker_concurrency,
                "pool_size": self.settings.worker_pool_size,
                "prefix": self.settings.amqp_prefix,
                "amqp_heartbeat_s": self.heartbeat_s,
            },
        )

    def supervise(self) -> int:
        """Wait for a stop signal; a thread that died stops the worker too, and makes the
        exit status non-zero. `stop` is set here, in the main thread's ordinary code,
        never in a signal handler."""
        while not self.stop.is_set():
            signum = self.signals.wait(MONITOR_SECONDS)
            if signum is not None:
                logger.info("draining", extra={"signal": signal.Signals(signum).name})
                self.stop.set()
                return 0
            dead = [t.name for t in [*self.services, self.consumer] if not t.is_alive()]
            if dead:
                logger.critical(
                    "service thread died; draining and exiting so the process is restarted",
                    extra={"threads": dead, "exit_status": THREAD_DIED},
                )
                self.stop.set()
                return THREAD_DIED
        return 0

    def shutdown(self) -> None:
        """Drain in the documented order (see the module docstring)."""
        self.stop.set()
        self.consumer.join()
        self.executor_threads.shutdown(wait=True)
        self.background.set()
        # One deadline for all of them, not one each: a drain is bounded however many
        # services are stuck on a dead link (they are daemon threads and end with us).
        deadline = time.monotonic() + JOIN_SECONDS
        for thread in self.services:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        stuck = [thread.name for thread in self.services if thread.is_alive()]
        if stuck:
            logger.warning("services still running at exit", extra={"threads": stuck})
        self.pool.close()
        self.services_pool.close()
        # Last: what the drain did is still scraped while it happens.
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        logger.info("worker stopped")

    def serve_metrics(self) -> None:
        """This worker's own /metrics (FLOWFORGE_METRICS_PORT), before anything else
        starts, so a port already taken stops the worker at once with a clear error."""
        port, address = self.settings.metrics_port, self.settings.metrics_address
        if not port:
            return
        try:
            self.metrics_server, _thread = start_http_server(port, address)
        except OSError as exc:
            taken = exc.errno == errno.EADDRINUSE
            why = "is in use by another process" if taken else f"cannot be bound: {exc}"
            raise ConfigError(
                f"FLOWFORGE_METRICS_PORT {port} on {address} {why}; give each worker on a "
                "host its own port (or 0 for none)"
            ) from None
        logger.info("serving metrics", extra={"address": address, "port": port})
