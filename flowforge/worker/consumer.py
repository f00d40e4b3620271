"""The queue consumer: owns its pika connection and feeds the executor threads.

Only this thread touches the channel. Executor threads hand their acks back with
`add_callback_threadsafe`, and a delivery is acked only after the database commit that
made its effect durable. Prefetch equals the number of executor threads, so RabbitMQ — not
an unbounded in-process queue — holds the backlog.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import pika

from flowforge.errors import BrokerUnavailable, DatabaseUnavailable
from flowforge.worker.broker import (
    BROKER_ERRORS,
    MAX_HEARTBEAT_S,
    Topology,
    Wakeup,
    connect,
    reconnect_delay,
)
from flowforge.worker.executor import Executor

logger = logging.getLogger(__name__)

# A delivery whose processing failed waits this long before it is handed back, so a
# database outage does not turn into a hot redelivery loop.
NACK_DELAY = 1.0


class Consumer(threading.Thread):
    """RabbitMQ → executor threads, with reconnects and a dead-letter path for poison."""

    def __init__(
        self,
        executor: Executor,
        amqp_url: str,
        topology: Topology,
        concurrency: int,
        stop: threading.Event,
        heartbeat_s: int = MAX_HEARTBEAT_S,
    ) -> None:
        super().__init__(name="consumer", daemon=True)
        self.executor = executor
        self.amqp_url = amqp_url
        self.heartbeat_s = heartbeat_s
        self.topology = topology
        self.concurrency = concurrency
        self.stop = stop
        self.executor_threads = ThreadPoolExecutor(concurrency, thread_name_prefix="executor")
        self._in_flight = 0
        self._lock = threading.Lock()
        self.connected = threading.Event()

    def run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                self._consume()
                failures = 0
            except (BrokerUnavailable, *BROKER_ERRORS) as exc:
                failures += 1
                self.connected.clear()
                logger.warning(
                    "broker connection lost; consumer will reconnect",
                    extra={"error": type(exc).__name__, "failures": failures},
                )
                self.stop.wait(reconnect_delay(failures))
            except Exception:
                # Anything else must not end consumption for good while the process still
                # looks alive: log it loudly, back off, reconnect (as the relay does).
                failures += 1
                self.connected.clear()
                logger.exception("consumer crashed; reconnecting", extra={"failures": failures})
                self.stop.wait(reconnect_delay(failures))

    def _consume(self) -> None:
        connection = connect(self.amqp_url, "flowforge-consumer", self.heartbeat_s)
        try:
            channel = connection.channel()
            self.topology.declare(channel)
            channel.basic_qos(prefetch_count=self.concurrency)
            tag = channel.basic_consume(self.topology.queue, partial(self._on_message, connection))
            self.connected.set()
            logger.info("consuming", extra={"queue": self.topology.queue})
            while not self.stop.is_set():
                connection.process_data_events(time_limit=0.5)
            # Draining: stop taking messages, then keep serving acks and AMQP heartbeats
            # until the steps already running have checkpointed.
            channel.basic_cancel(tag)
            while self._busy():
                connection.process_data_events(time_limit=0.2)
        finally:
            self.connected.clear()
            if connection.is_open:
                with contextlib.suppress(*BROKER_ERRORS):
                    connection.close()

    def _busy(self) -> bool:
        with self._lock:
            return self._in_flight > 0

    def _on_message(
        self,
        connection: pika.BlockingConnection,
        channel: Any,
        method: Any,
        _props: Any,
        body: bytes,
    ) -> None:
        if self.stop.is_set():
            # Draining: deliveries that arrive before basic_cancel takes effect go back to
            # the queue for another worker instead of starting new work here.
            channel.basic_reject(method.delivery_tag, requeue=True)
            return
        try:
            wakeup = Wakeup.decode(body)
        except ValueError as exc:
            # Never log the body: it is not ours to print.
            logger.error(
                "malformed message dead-lettered",
                extra={"reason": str(exc)[:200], "bytes": len(body)},
            )
            channel.basic_reject(method.delivery_tag, requeue=False)
            return
        with self._lock:
            self._in_flight += 1
        future = self.executor_threads.submit(self.executor.handle, wakeup)
        future.add_done_callback(
            partial(
                self._settle, connection, channel, method.delivery_tag, method.redelivered, wakeup
            )
        )

    def _settle(
        self,
        connection: pika.BlockingConnection,
        channel: Any,
        delivery_tag: int,
        redelivered: bool,
        wakeup: Wakeup,
        future: Future[None],
    ) -> None:
        """Runs on an executor thread: decide, then let the consumer thread act."""
        error = future.exception()
        log = {"execution_id": wakeup.execution_id, "step": wakeup.step_id}
        if error is None:
            action = partial(channel.basic_ack, delivery_tag)
        else:
            if isinstance(error, DatabaseUnavailable):
                logger.warning("database unavailable; delivery handed back", extra=log)
            else:
                logger.error("wake-up failed", extra=log, exc_info=error)
            self.stop.wait(NACK_DELAY)
            # An outage is retried for as long as it lasts; any other error twice in a row
            # dead-letters the message. The database still holds the work either way, and
            # the reconciler re-dispatches ready steps whose message is gone.
            requeue = isinstance(error, DatabaseUnavailable) or not redelivered
            action = partial(channel.basic_nack, delivery_tag, requeue=requeue)
        try:
            connection.add_callback_threadsafe(partial(self._run_on_channel, channel, action))
        except BROKER_ERRORS:
            # The connection died: the broker redelivers, and duplicates are harmless.
            self._done()

    def _run_on_channel(self, channel: Any, action: Any) -> None:
        try:
            if channel.is_open:
                action()
        finally:
            self._done()

    def _done(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def join_executor_threads(self) -> None:
        """Wait for running steps; called after the consumer stopped taking messages."""
        self.executor_threads.shutdown(wait=True)
