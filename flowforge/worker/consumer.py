"""The queue consumer: owns its pika connection and feeds the Worker's executor threads.

Only this thread touches the channel. Executor threads hand their acks back with
`add_callback_threadsafe`, and a delivery is acked only after the database commit that
made its effect durable. Prefetch equals the number of executor threads, so RabbitMQ —
not an unbounded in-process queue — holds the backlog.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
from concurrent.futures import Executor as Threads
from concurrent.futures import Future
from functools import partial
from typing import Any

import pika

from flowforge import faults
from flowforge.errors import BrokerUnavailable, DatabaseUnavailable
from flowforge.observe import metrics
from flowforge.worker.broker import (
    BROKER_ERRORS,
    MAX_HEARTBEAT_S,
    BrokerLoop,
    QueueHead,
    Topology,
    Wakeup,
    connect,
)
from flowforge.worker.executor import Executor

logger = logging.getLogger(__name__)

# A delivery whose processing failed waits this long before it is handed back, so a
# database outage does not turn into a hot redelivery loop.
NACK_DELAY = 1.0


class Settlement(enum.Enum):
    """What becomes of a delivery once its wake-up was handled."""

    ACK = "ack"
    REQUEUE = "requeue"
    DEAD_LETTER = "dead-letter"


def settlement(error: BaseException | None, redelivered: bool) -> Settlement:
    """Ack after success. An outage is retried for as long as it lasts; any other error
    twice in a row dead-letters the message. The database still holds the work either
    way, and the reconciler re-dispatches ready steps whose message is gone."""
    if error is None:
        return Settlement.ACK
    if isinstance(error, DatabaseUnavailable) or not redelivered:
        return Settlement.REQUEUE
    return Settlement.DEAD_LETTER


class Unsettled:
    """How many deliveries taken on one connection still wait for their ack or nack.

    One count per connection, never one for the consumer: when a connection dies, pika
    drops the settlements still queued on it (RabbitMQ redelivers those messages), so they
    never run. A count shared across connections would then never come back to zero, and
    the drain — waiting on the next connection for acks that can no longer be sent —
    would never end (the randomized fault run's seed 204).
    """

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self._count += 1

    def done(self) -> None:
        with self._lock:
            self._count -= 1

    def pending(self) -> bool:
        with self._lock:
            return self._count > 0


class Consumer(BrokerLoop):
    """RabbitMQ → executor threads, with reconnects and a dead-letter path for poison.

    The threads belong to the Worker; the consumer only submits to them and counts, per
    connection, what is not settled yet, so it can keep serving acks until every step
    running for that connection has settled.
    """

    outage_log = "broker connection lost; %(name)s will reconnect"

    def __init__(
        self,
        executor: Executor,
        amqp_url: str,
        topology: Topology,
        threads: Threads,
        concurrency: int,
        stop: threading.Event,
        heartbeat_s: int = MAX_HEARTBEAT_S,
        head: QueueHead | None = None,
    ) -> None:
        super().__init__("consumer", stop)
        self.head = head
        self.executor = executor
        self.amqp_url = amqp_url
        self.heartbeat_s = heartbeat_s
        self.topology = topology
        self.threads = threads
        self.concurrency = concurrency
        self.connected = threading.Event()

    def serve(self) -> float:
        self._consume()
        return 0.0

    def _consume(self) -> None:
        connection = connect(self.amqp_url, "flowforge-consumer", self.heartbeat_s)
        unsettled = Unsettled()  # this connection's own; it dies with it
        try:
            channel = self.topology.declare(connection.channel())
            channel.basic_qos(prefetch_count=self.concurrency)
            tag = channel.basic_consume(
                self.topology.queue, partial(self._on_message, connection, unsettled)
            )
            # The broker cancels a consumer whose queue went away (deleted, or a quorum
            # queue's leader lost while this connection is on another node) and keeps
            # the connection up: pika only drops the consumer, so without this the worker
            # would sit on a healthy connection that delivers nothing.
            cancelled: list[Any] = []
            channel.add_on_cancel_callback(cancelled.append)
            self.connected.set()
            logger.info("consuming", extra={"queue": self.topology.queue})
            while not self.stop.is_set():
                connection.process_data_events(time_limit=0.5)
                if cancelled:
                    raise BrokerUnavailable(
                        f"consumer of {self.topology.queue} cancelled by the broker"
                    )
            # Draining: stop taking messages, then keep serving acks and AMQP heartbeats
            # until the steps already running have checkpointed. Steps taken on an earlier
            # connection cannot be acked any more; the Worker waits for them on its own.
            channel.basic_cancel(tag)
            while unsettled.pending():
                connection.process_data_events(time_limit=0.2)
        finally:
            self.connected.clear()
            if connection.is_open:
                with contextlib.suppress(*BROKER_ERRORS):
                    connection.close()

    def _on_message(
        self,
        connection: pika.BlockingConnection,
        unsettled: Unsettled,
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
            metrics.MALFORMED_DEAD_LETTERED.inc()
            return
        if self.head is not None:
            self.head.saw(wakeup)
        unsettled.add()
        future = self.threads.submit(self.executor.handle, wakeup)
        future.add_done_callback(
            partial(
                self._settle,
                connection,
                unsettled,
                channel,
                method.delivery_tag,
                method.redelivered,
                wakeup,
            )
        )

    def _settle(
        self,
        connection: pika.BlockingConnection,
        unsettled: Unsettled,
        channel: Any,
        delivery_tag: int,
        redelivered: bool,
        wakeup: Wakeup,
        future: Future[None],
    ) -> None:
        """Runs on an executor thread: decide, then let the consumer thread act."""
        error = future.exception()
        log = {"execution_id": wakeup.execution_id, "step": wakeup.step_id}
        decision = settlement(error, redelivered)
        if decision is Settlement.ACK:
            action = partial(channel.basic_ack, delivery_tag)
        else:
            if isinstance(error, DatabaseUnavailable):
                logger.warning("database unavailable; delivery handed back", extra=log)
            else:
                logger.error("wake-up failed", extra=log, exc_info=error)
            if decision is Settlement.DEAD_LETTER:
                metrics.FAILED_DEAD_LETTERED.inc()
                self._count_failure(wakeup, log)
            self.stop.wait(NACK_DELAY)
            requeue = decision is Settlement.REQUEUE
            action = partial(channel.basic_nack, delivery_tag, requeue=requeue)
        try:
            connection.add_callback_threadsafe(
                partial(self._run_on_channel, channel, action, unsettled)
            )
        except BROKER_ERRORS:
            # The connection died: the broker redelivers, and duplicates are harmless.
            unsettled.done()

    def _count_failure(self, wakeup: Wakeup, log: dict[str, str]) -> None:
        """Tell the reconciler this step's wake-up failed, so it re-dispatches it ever more
        rarely. A lost wake-up is never counted: it is re-dispatched every interval. When
        even this write fails the step is re-dispatched at the usual pace, which is safe."""
        try:
            self.executor.wakeup_failed(wakeup)
        except Exception:  # whatever broke the wake-up may break this too; settle anyway
            logger.warning("failed wake-up not counted", extra=log, exc_info=True)

    def _run_on_channel(self, channel: Any, action: Any, unsettled: Unsettled) -> None:
        try:
            faults.hit("before_settle")
            if channel.is_open:
                action()
        finally:
            unsettled.done()
