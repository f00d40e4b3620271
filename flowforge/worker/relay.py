"""The outbox relay: publishes committed wake-ups to RabbitMQ, in confirmed batches.

A batch is one PostgreSQL transaction: delete up to BATCH rows (FOR UPDATE SKIP LOCKED),
publish them as persistent, mandatory messages, wait once for the publisher confirms of
the whole batch, and commit the delete only then — the broker has taken responsibility
for every message it acked and did not return as unroutable. Returned and nacked
(refused) ones are put back; after a refusal the relay reconnects, since a channel whose
view of a quorum queue is stale refuses everything (broker.Confirms says why this is not
an AMQP transaction any more: RabbitMQ 3.10 commits those over a refusal). One wait per
batch instead of one per message is what makes the relay fast; see the issue for the
figures.

A batch of one wake-up for a pure step (the steady trickle: a webhook, then its chain of
transforms) is not published at all: the relay runs the step in the transaction that
deletes its row (Executor.run_pure), which then commits synchronously. Crash safety is
the outbox's own: until that commit the row is there for the next relay. No message, no
delivery, no ack and no hand-off between threads; under load batches are larger and go
through RabbitMQ to every worker's executor threads as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import psycopg
import psycopg_pool

from flowforge.domain.engine import PURE_TYPES
from flowforge.errors import BrokerUnavailable, DatabaseUnavailable
from flowforge.observe import metrics
from flowforge.store import notifications
from flowforge.store.db import pipelined_transaction, wrap_exceptions
from flowforge.store.outbox import LISTEN_OUTBOX, NOTIFY_IF_PENDING, PUT_BACK, TAKE_BATCH
from flowforge.store.runs import after_commit
from flowforge.worker.broker import (
    BROKER_ERRORS,
    MAX_HEARTBEAT_S,
    ROUTING_KEY,
    BrokerLoop,
    Confirms,
    Topology,
    Wakeup,
    connect,
)

logger = logging.getLogger(__name__)

BATCH = 500
# Without a NOTIFY (lost, or sent by a writer that forgot) the relay still looks this often.
POLL_SECONDS = 1.0


class Relay(BrokerLoop):
    """Outbox → RabbitMQ, woken by LISTEN/NOTIFY with a polling fallback."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        database_url: str,
        amqp_url: str,
        topology: Topology,
        stop: threading.Event,
        heartbeat_s: int = MAX_HEARTBEAT_S,
        *,
        run_pure: Callable[[psycopg.Connection, Wakeup], bool] | None = None,
        taking_work: Callable[[], bool] = lambda: True,
        wake_notifier: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__("relay", stop)
        # The notifier sleeps while no notification endpoint is enabled; enabling one
        # NOTIFYs WAKE_CHANNEL, which this LISTEN connection hears for it (no connection
        # of its own).
        self.wake_notifier = wake_notifier
        # Runs a lone pure wake-up here instead of publishing it (None: always publish),
        # while the worker still takes work (not once its drain began).
        self.run_pure = run_pure
        self.taking_work = taking_work
        self.ran_inline = 0
        # A wake-up whose run here failed is published on the next pass instead: the
        # consumer's path retries, counts and dead-letters it like any other.
        self._publish_only: int | None = None
        self.heartbeat_s = heartbeat_s
        self.pool = pool
        self.database_url = database_url
        self.amqp_url = amqp_url
        self.topology = topology
        self.published = 0
        self._broker: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._confirms: Confirms | None = None
        self._listener: psycopg.Connection | None = None
        self._returned: list[int] = []

    def serve(self) -> float:
        self._ensure_listener()
        self._ensure_channel()
        while self.publish_batch() == BATCH and not self.stop.is_set():
            pass
        self._wait_for_notify()
        return 0.0

    def idle(self, seconds: float) -> bool:
        """Back off (a database outage) while the broker connection stays serviced: pika
        sends and checks heartbeats only inside its own calls, and a relay that slept
        through a few would be dropped and reconnect once the database is back."""
        deadline = time.monotonic() + seconds
        while not self.stop.wait(min(self._slice_s(), max(0.0, deadline - time.monotonic()))):
            self._service_broker()
            if time.monotonic() >= deadline:
                return False
        return True

    def _slice_s(self) -> float:
        """How long the relay may leave the broker connection alone."""
        return min(POLL_SECONDS, self.heartbeat_s / 4) if self.heartbeat_s > 0 else POLL_SECONDS

    def _service_broker(self) -> None:
        """Answer and send heartbeats; a connection that died is dropped quietly (the next
        pass reconnects and says so)."""
        if self._broker is None or not self._broker.is_open:
            return
        try:
            self._broker.process_data_events(0)
        except BROKER_ERRORS:
            self._close_broker()

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection, waited for in heartbeat-sized slices (the pool's timeout in
        all) with the broker serviced between them: while the database is down, the
        pool's wait would otherwise outlast the AMQP heartbeat."""
        deadline = time.monotonic() + self.pool.timeout
        while True:
            try:
                with wrap_exceptions():
                    conn = self.pool.getconn(timeout=self._slice_s())
                break
            except DatabaseUnavailable:  # the pool's timeout (db.wrap_exceptions)
                if time.monotonic() >= deadline or self.stop.is_set():
                    raise
                self._service_broker()
        try:
            with conn:  # as the pool's own connection(): a transaction left open ends
                yield conn
        finally:
            self.pool.putconn(conn)

    def on_failure(self, error: Exception) -> None:
        """Reopen only the side that failed; after anything unexpected, both."""
        if not isinstance(error, DatabaseUnavailable):
            self._close_broker()
        if not isinstance(error, BrokerUnavailable):
            self._close_listener()

    def close(self) -> None:
        self._close_broker()
        self._close_listener()

    def publish_batch(self) -> int:
        """Publish and delete one batch (or run its lone pure step); returns how many rows
        it claimed."""
        # Pipelined: BEGIN travels with the claim and COMMIT with the last write, so a
        # lone pure step run here costs three round trips, a published batch three (its
        # claim is settled before the broker is waited on).
        # A pure step run here may have dispatched the next: the relays hear of it after
        # the commit (NOTIFY_IF_PENDING), as after any unit of work; a published batch or
        # a run that wrote no wake-up (a chain's last step) sends nothing (issue 41).
        woke = [False]
        with (
            after_commit(),
            wrap_exceptions(),
            self._connection() as conn,
            pipelined_transaction(
                conn, then=lambda: NOTIFY_IF_PENDING if woke[0] else None
            ) as pipeline,
        ):
            rows = sorted(conn.execute(TAKE_BATCH, {"limit": BATCH}).fetchall())
            if not rows:
                return 0
            if self._runs_here(rows):
                woke[0] = self._run_here(conn, rows[0])
                return 1
            # Idle in transaction from here, not active: while the broker takes its time
            # the server's idle-in-transaction timeout still bounds how long the claimed
            # rows stay locked away from every other relay.
            pipeline.sync()
            returned, refused = self._publish(rows)
            if returned:
                logger.error(
                    "broker returned unroutable wake-ups; keeping them for later",
                    extra={"count": len(returned)},
                )
                if self.topology.declare(self._channel) is not self._channel:
                    self._close_broker()  # a new channel lacks confirm mode: reconnect next pass
            if refused:
                logger.error(
                    "broker refused wake-ups; keeping them for later",
                    extra={"count": len(refused)},
                )
            if kept_ids := returned | refused:
                woke[0] = True  # back in the outbox: another relay may take them sooner
                kept = [row for row in rows if row[0] in kept_ids]
                conn.execute(
                    PUT_BACK,
                    {
                        key: [row[i] for row in kept]
                        for i, key in enumerate(("id", "execution_id", "step_id", "created_at"))
                    },
                )
        published = len(rows) - len(kept_ids)
        self.published += published
        metrics.WAKEUPS_PUBLISHED.inc(published)
        if refused:
            # This channel may refuse everything from now on (its view of a quorum queue
            # names a leader that is gone): a new connection, after the loop's back-off.
            self._close_broker()
            raise BrokerUnavailable(f"RabbitMQ refused {len(refused)} of {len(rows)} wake-ups")
        return len(rows)

    def _publish(self, rows: list[Any]) -> tuple[set[int], set[int]]:
        """Publish a claimed batch's wake-ups with confirms; returns the outbox ids the
        broker returned (unroutable) and those it refused, both kept for later."""
        self._returned.clear()
        assert self._broker is not None and self._confirms is not None
        tags: dict[int, int] = {}  # delivery tag -> outbox id
        for outbox_id, execution_id, step_id, created_at, _type in rows:
            tag = self._confirms.publish(
                self.topology.exchange,
                ROUTING_KEY,
                Wakeup(str(execution_id), step_id, created_at).encode(),
                pika.BasicProperties(
                    delivery_mode=pika.DeliveryMode.Persistent,
                    content_type="application/json",
                    message_id=str(outbox_id),
                ),
                mandatory=True,
            )
            tags[tag] = outbox_id
        # (A tag of an earlier batch that failed before its wait may be settled only
        # now: its rows were rolled back into the outbox, so it is not ours to count.)
        refused = {tags[tag] for tag in self._confirms.wait() if tag in tags}
        # A return precedes its message's ack on the wire; this dispatches any still
        # pending to _on_return.
        self._broker.process_data_events(0)
        return set(self._returned), refused

    def _runs_here(self, rows: list[Any]) -> bool:
        if self.run_pure is None or len(rows) != 1 or not self.taking_work():
            return False
        outbox_id, _eid, _sid, _created_at, step_type = rows[0]
        return step_type in PURE_TYPES and outbox_id != self._publish_only

    def _run_here(self, conn: psycopg.Connection, row: Any) -> bool:
        """Run a lone pure wake-up; whether it may have written another."""
        assert self.run_pure is not None
        outbox_id, execution_id, step_id = row[:3]
        try:
            with wrap_exceptions():
                woke = self.run_pure(conn, Wakeup(str(execution_id), step_id))
        except DatabaseUnavailable:
            raise
        except Exception:
            # Rolled back with the delete; the next pass publishes it.
            self._publish_only = outbox_id
            raise
        self.ran_inline += 1
        return woke

    def _on_return(self, _channel: Any, _method: Any, props: Any, _body: bytes) -> None:
        self._returned.append(int(props.message_id))

    def _ensure_channel(self) -> None:
        if self._channel is not None and self._channel.is_open:
            return
        self._close_broker()
        self._broker = connect(self.amqp_url, "flowforge-relay", self.heartbeat_s)
        channel = self.topology.declare(self._broker.channel())
        channel.add_on_return_callback(self._on_return)
        self._confirms = Confirms(self._broker, channel)
        self._channel = channel
        logger.info("relay connected to broker")

    def _ensure_listener(self) -> None:
        if self._listener is not None and not self._listener.closed:
            return
        with wrap_exceptions():
            self._listener = psycopg.connect(self.database_url, autocommit=True)
            self._listener.execute(LISTEN_OUTBOX)
            self._listener.execute(notifications.LISTEN_WAKE)
        # A wake-up NOTIFYed before this LISTEN (the worker's start, a reconnection) was
        # heard by no one: the notifier looks once now instead of after its IDLE_S.
        self.wake_notifier()

    def _wait_for_notify(self) -> None:
        """Wait up to POLL_SECONDS for a NOTIFY, answering the broker's heartbeats meanwhile.

        pika's BlockingConnection sends and checks heartbeats only inside its own calls; a
        relay that sat in LISTEN through a quiet spell would be dropped by the broker for
        missed heartbeats, and the first publish after it would fail.
        """
        assert self._listener is not None and self._broker is not None
        slice_s = self._slice_s()
        deadline = time.monotonic() + POLL_SECONDS
        notified = False
        with wrap_exceptions():
            while not notified and not self.stop.is_set():
                self._broker.process_data_events(0)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for heard in self._listener.notifies(timeout=min(slice_s, left), stop_after=1):
                    notified = self._for_relay(heard) or notified
            # Several commits may have notified while we published: one pass serves them all.
            for heard in self._listener.notifies(timeout=0):
                self._for_relay(heard)

    def _for_relay(self, heard: psycopg.Notify) -> bool:
        """Whether a NOTIFY is the outbox's; the notifier's wake-up is handed on."""
        if heard.channel == notifications.WAKE_CHANNEL:
            self.wake_notifier()
            return False
        return True

    def _close_broker(self) -> None:
        broker, self._broker, self._channel, self._confirms = self._broker, None, None, None
        if broker is not None and broker.is_open:
            with contextlib.suppress(*BROKER_ERRORS):
                broker.close()

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
