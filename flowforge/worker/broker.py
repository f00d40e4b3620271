"""RabbitMQ topology and connections; pika's exceptions stop here.

Topology (names carry FLOWFORGE_AMQP_PREFIX so several deployments or test runs can
share one broker): a durable direct exchange `<prefix>` routes wake-ups to the durable
queue `<prefix>.steps`, which dead-letters rejected messages through the fanout
exchange `<prefix>.dlx` into `<prefix>.dead`. Both queues are of the type
FLOWFORGE_AMQP_QUEUE_TYPE names: `quorum` (the default: replicated on a cluster, they
survive the loss of a node) or `classic`. A queue that already exists with the other
type is used as it is, with a warning, instead of failing every declare with 406 (see
docs/howto/several-hosts.md for moving classic queues to quorum).

FLOWFORGE_AMQP_URL may list several nodes, comma-separated: each connection tries them in
a new random order (kombu's "shuffle" failover), so clients spread over the cluster and a
lost node costs one failed attempt, not an outage.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pika
import pika.exceptions

from flowforge.errors import BrokerUnavailable
from flowforge.observe import metrics
from flowforge.worker.loop import Loop

logger = logging.getLogger(__name__)

ROUTING_KEY = "step"
PRECONDITION_FAILED = 406
MAX_BACKOFF = 10.0
# AMQP heartbeat timeout bounds: under 2 s a busy machine drops healthy connections, and
# above 10 s a blackholed broker or a frozen worker goes unnoticed for too long.
MIN_HEARTBEAT_S = 2
MAX_HEARTBEAT_S = 10
# How long a batch may wait for its publisher confirms before it counts as not published
# (its rows stay in the outbox): a quorum queue without a leader answers once it has one.
CONFIRM_TIMEOUT_S = 30.0
# Exceptions that mean "the broker or the connection is gone", not a bug of ours.
BROKER_ERRORS: tuple[type[Exception], type[Exception]] = (pika.exceptions.AMQPError, OSError)


@contextmanager
def broker_errors() -> Iterator[None]:
    """pika's exceptions (and the socket's) as BrokerUnavailable: the services that hold
    a broker connection (consumer, relay) run each pass inside this, so nothing above
    this module (worker/loop's error policy) sees pika."""
    try:
        yield
    except BROKER_ERRORS as exc:
        said = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise BrokerUnavailable(
            f"{type(exc).__name__}: {said}" if said else type(exc).__name__
        ) from exc


@dataclass(frozen=True)
class Topology:
    """The names of everything FlowForge declares on the broker."""

    prefix: str
    queue_type: str = "quorum"

    @property
    def exchange(self) -> str:
        return self.prefix

    @property
    def queue(self) -> str:
        return f"{self.prefix}.steps"

    @property
    def dead_exchange(self) -> str:
        return f"{self.prefix}.dlx"

    @property
    def dead_queue(self) -> str:
        return f"{self.prefix}.dead"

    def declare(self, channel: Any) -> Any:
        """Declare it all, idempotently; every connecting component does this first.

        Returns the channel to go on with: a new one of the same connection when the
        broker closed this one because a queue exists with the other type."""
        channel.exchange_declare(self.dead_exchange, exchange_type="fanout", durable=True)
        channel = self._declare_queue(channel, self.dead_queue, {})
        channel.queue_bind(self.dead_queue, self.dead_exchange)
        channel.exchange_declare(self.exchange, exchange_type="direct", durable=True)
        channel = self._declare_queue(
            channel, self.queue, {"x-dead-letter-exchange": self.dead_exchange}
        )
        channel.queue_bind(self.queue, self.exchange, routing_key=ROUTING_KEY)
        return channel

    def _declare_queue(self, channel: Any, name: str, arguments: dict[str, Any]) -> Any:
        # A classic queue is declared without the argument, exactly as before it existed,
        # so that queues of existing installations stay equivalent.
        quorum = self.queue_type == "quorum"
        typed = {**arguments, "x-queue-type": "quorum"} if quorum else arguments
        try:
            channel.queue_declare(name, durable=True, arguments=typed)
            return channel
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != PRECONDITION_FAILED or "x-queue-type" not in exc.reply_text:
                raise
        channel = channel.connection.channel()
        channel.queue_declare(name, passive=True)
        logger.warning(
            "queue %s exists with another type than FLOWFORGE_AMQP_QUEUE_TYPE=%s; using it "
            "as it is (docs/howto/several-hosts.md: moving to quorum queues)",
            name,
            self.queue_type,
        )
        return channel


def heartbeat_seconds(amqp_url: str, lease_s: float) -> int:
    """The AMQP heartbeat timeout: the URL's `heartbeat=` if it has one, else half a lease
    within [2, 10] s.

    A frozen worker (SIGSTOP, a stalled VM) keeps the wake-ups it prefetched until the
    broker closes its connection for missed heartbeats, which RabbitMQ does two to three
    timeouts after the last frame; only then are they delivered to a live worker. Tying
    the timeout to the lease lets a takeover finish within a couple of lease periods.
    """
    given = parse_qs(urlsplit(broker_urls(amqp_url)[0]).query).get("heartbeat")
    if given:
        return int(given[-1])
    return max(MIN_HEARTBEAT_S, min(MAX_HEARTBEAT_S, math.ceil(lease_s / 2)))


def broker_urls(amqp_url: str) -> list[str]:
    """The URLs of FLOWFORGE_AMQP_URL, a comma-separated list (a comma inside a password
    is written %2C); at least one."""
    urls = [url.strip() for url in amqp_url.split(",") if url.strip()]
    return urls or [amqp_url]


def connect(
    amqp_url: str, name: str, heartbeat_s: int = MAX_HEARTBEAT_S
) -> pika.BlockingConnection:
    """Open a connection that identifies itself and keeps AMQP heartbeats short, to the
    first node that answers of the URLs in a new random order.

    A URL's own `heartbeat=` query parameter, when present, wins over `heartbeat_s`.
    """
    urls = broker_urls(amqp_url)
    random.shuffle(urls)
    attempts = []
    for url in urls:
        params = pika.URLParameters(url)
        if "heartbeat" not in parse_qs(urlsplit(url).query):
            params.heartbeat = heartbeat_s
        params.blocked_connection_timeout = 30
        params.socket_timeout = 5
        params.connection_attempts = 1
        params.client_properties = {"connection_name": name}
        attempts.append(params)
    try:
        connection = pika.BlockingConnection(attempts)
    # pika raises ValueError ("Expected connected socket") when the peer resets the
    # socket between the TCP handshake and the AMQP one: a broker problem like any other.
    except (*BROKER_ERRORS, ValueError) as exc:
        raise BrokerUnavailable(f"cannot connect to RabbitMQ: {type(exc).__name__}") from exc
    _count_connection(name)
    return connection


_connected: set[str] = set()


def _count_connection(name: str) -> None:
    """Every connection of a component after its first is a reconnect."""
    if name in _connected:
        component = name.removeprefix("flowforge-")
        (metrics.RECONNECTS.get(component) or metrics.BROKER_RECONNECTS.labels(component)).inc()
    _connected.add(name)


class Confirms:
    """Publisher confirms for batches on one channel: publish many messages, then wait once
    until the broker acked or nacked each of them.

    Not AMQP transactions: RabbitMQ 3.10 answers tx.commit with commit-ok even when a
    quorum queue refused a message of the transaction outright — the channel's view of
    the queue still names its leader on a node that is gone (what a client reconnecting
    right after the loss of that node gets, until the new leader is written down), or the
    queue is full with reject-publish. The refusal stays inside the broker's channel, and
    that channel goes on refusing every later publish the same way. A relay that trusted
    commit-ok deleted the outbox rows of wake-ups that were never queued, for as long as
    its connection lived (test_broker_node_loss: no progress for 45 s). In confirm mode
    the same refusal is a nack.

    Not pika's BlockingChannel.confirm_delivery() either: it waits for each message's
    confirm before the next publish, a round trip and a quorum write per message, where a
    batch should cost one. pika's blocking adapter has no batched form, so this turns
    confirm mode on through the channel's underlying pika Channel (its only use of pika
    internals) and waits in process_data_events, which keeps the heartbeats going.
    """

    def __init__(
        self,
        connection: pika.BlockingConnection,
        channel: Any,
        timeout_s: float = CONFIRM_TIMEOUT_S,
    ) -> None:
        self._connection = connection
        self._channel = channel
        self.timeout_s = timeout_s
        self._last_tag = 0  # the broker numbers this channel's publishes 1, 2, ...
        self._unsettled: set[int] = set()
        self._lowest = 1  # no tag below this one is unsettled
        self._nacked: set[int] = set()
        selected: list[bool] = []

        def on_select_ok(_frame: Any) -> None:
            selected.append(True)
            self._wake()

        channel._impl.confirm_delivery(ack_nack_callback=self._on_confirm, callback=on_select_ok)
        self._wait_until(lambda: bool(selected))

    def publish(
        self, exchange: str, routing_key: str, body: bytes, properties: Any, *, mandatory: bool
    ) -> int:
        """Publish without waiting; returns the message's delivery tag."""
        # Counted first: its confirm may be handled inside basic_publish already.
        self._last_tag += 1
        self._unsettled.add(self._last_tag)
        self._channel.basic_publish(exchange, routing_key, body, properties, mandatory=mandatory)
        return self._last_tag

    def wait(self) -> set[int]:
        """Wait until every message published so far is settled; returns the delivery tags
        the broker nacked (refused). BrokerUnavailable when the channel closes or the
        confirms take longer than `timeout_s`: then nothing of the batch counts as sent."""
        self._wait_until(lambda: not self._unsettled)
        nacked, self._nacked = self._nacked, set()
        return nacked

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = method.delivery_tag
        if method.multiple:  # every tag up to this one
            settled = self._unsettled.intersection(range(self._lowest, tag + 1))
            self._lowest = max(self._lowest, tag + 1)
        else:
            settled = self._unsettled.intersection((tag,))
        self._unsettled -= settled
        if isinstance(method, pika.spec.Basic.Nack):
            self._nacked |= settled
        if not self._unsettled:
            self._wake()

    def _wake(self) -> None:
        # process_data_events returns early on a ready timer, not on a frame handled by
        # the underlying channel: without this it would sit out its whole time limit.
        # Only once everything is settled, not per confirm: a batch's wait is one call.
        self._connection.call_later(0, _nothing)

    def _wait_until(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not done():
            if not self._channel.is_open:
                raise BrokerUnavailable("the broker closed the channel before confirming")
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrokerUnavailable(f"no publisher confirm within {self.timeout_s:g} s")
            self._connection.process_data_events(time_limit=left)


def _nothing() -> None:
    """A timer callback that only ends a process_data_events call."""


@dataclass(frozen=True)
class Wakeup:
    """The message body: which step of which execution may have work to do, and when it
    was queued (its outbox row's created_at, the database's clock), so that a consumer
    can tell how far into the queue it has got (QueueHead)."""

    execution_id: str
    step_id: str
    queued_at: datetime | None = None

    def encode(self) -> bytes:
        body: dict[str, str] = {"execution_id": self.execution_id, "step_id": self.step_id}
        if self.queued_at is not None:
            body["queued_at"] = self.queued_at.isoformat()
        return json.dumps(body).encode()

    @classmethod
    def decode(cls, body: bytes) -> Wakeup:
        """Parse a message; ValueError for anything that is not a wake-up. A missing or
        unreadable `queued_at` (an older relay's message) is no reason to refuse one."""
        try:
            data = json.loads(body)
        except RecursionError:
            # Deeply nested JSON must be poison like any other, not a crash of the consumer.
            raise ValueError("message nests too deeply") from None
        if not isinstance(data, dict):
            raise ValueError("message is not a JSON object")
        execution_id, step_id = data.get("execution_id"), data.get("step_id")
        if not isinstance(execution_id, str) or not isinstance(step_id, str):
            raise ValueError("message lacks execution_id or step_id")
        queued_at, given = None, data.get("queued_at")
        if isinstance(given, str):
            with contextlib.suppress(ValueError):
                queued_at = datetime.fromisoformat(given)
        if queued_at is not None and queued_at.tzinfo is None:
            queued_at = None  # never compared with the database's aware times
        return cls(str(uuid.UUID(execution_id)), step_id, queued_at)


class QueueHead:
    """How far this worker's consumer has got into the queue: the latest `queued_at` of
    the wake-ups it received, and when it last received one.

    RabbitMQ hands a queue's messages out in about the order they were published, so a
    wake-up queued after the head is still waiting its turn, however old: under a backlog
    the reconciler measures a wake-up's age against the head, not the clock, and does not
    publish another copy of one that is still queued (docs/reference/configuration.md,
    FLOWFORGE_RECONCILE_SECONDS). Once nothing arrives for a while (an empty, purged or
    unreachable queue) the head is unknown and the clock decides again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reached: datetime | None = None
        self._seen_at = 0.0

    def saw(self, wakeup: Wakeup) -> None:
        """A delivery of `wakeup` arrived."""
        if wakeup.queued_at is None:
            return
        with self._lock:
            if self._reached is None or wakeup.queued_at > self._reached:
                self._reached = wakeup.queued_at
            self._seen_at = time.monotonic()

    def reached(self, within_s: float) -> datetime | None:
        """The head, if a wake-up arrived in the last `within_s` seconds; else None."""
        with self._lock:
            if time.monotonic() - self._seen_at > within_s:
                return None
            return self._reached


def reconnect_delay(failures: int) -> float:
    """Exponential back-off with jitter, so many workers do not reconnect in step."""
    ceiling = min(MAX_BACKOFF, 0.25 * 2 ** min(failures, 8))
    return random.uniform(ceiling / 2, ceiling)


class BrokerLoop(Loop):
    """A service thread that holds a broker connection (the consumer, the relay): each
    pass (`serve`) runs inside broker_errors, so the loop's error policy meets pika's
    failures as BrokerUnavailable, and a lost connection is retried with jittered
    back-off (reconnect_delay)."""

    def step(self) -> float:
        with broker_errors():
            return self.serve()

    def serve(self) -> float:
        """One pass; how long to wait before the next one."""
        raise NotImplementedError

    def backoff(self, failures: int) -> float:
        return reconnect_delay(failures)
