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

import json
import logging
import math
import random
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pika
import pika.exceptions

from flowforge import metrics
from flowforge.errors import BrokerUnavailable

logger = logging.getLogger(__name__)

ROUTING_KEY = "step"
PRECONDITION_FAILED = 406
MAX_BACKOFF = 10.0
# AMQP heartbeat timeout bounds: under 2 s a busy machine drops healthy connections, and
# above 10 s a blackholed broker or a frozen worker goes unnoticed for too long.
MIN_HEARTBEAT_S = 2
MAX_HEARTBEAT_S = 10
# Exceptions that mean "the broker or the connection is gone", not a bug of ours.
BROKER_ERRORS: tuple[type[Exception], type[Exception]] = (pika.exceptions.AMQPError, OSError)


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


@dataclass(frozen=True)
class Wakeup:
    """The message body: which step of which execution may have work to do."""

    execution_id: str
    step_id: str

    def encode(self) -> bytes:
        return json.dumps({"execution_id": self.execution_id, "step_id": self.step_id}).encode()

    @classmethod
    def decode(cls, body: bytes) -> Wakeup:
        """Parse a message; ValueError for anything that is not a wake-up."""
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
        return cls(str(uuid.UUID(execution_id)), step_id)


def reconnect_delay(failures: int) -> float:
    """Exponential back-off with jitter, so many workers do not reconnect in step."""
    ceiling = min(MAX_BACKOFF, 0.25 * 2 ** min(failures, 8))
    return random.uniform(ceiling / 2, ceiling)
