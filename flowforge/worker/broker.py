"""RabbitMQ topology and connections; pika's exceptions stop here.

Topology (names carry FLOWFORGE_AMQP_PREFIX so several deployments or test runs can
share one broker): a durable direct exchange `<prefix>` routes wake-ups to the durable
queue `<prefix>.steps`, which dead-letters rejected messages through the fanout
exchange `<prefix>.dlx` into `<prefix>.dead`.
"""

from __future__ import annotations

import json
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

ROUTING_KEY = "step"
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

    def declare(self, channel: Any) -> None:
        """Declare it all, idempotently; every connecting component does this first."""
        channel.exchange_declare(self.dead_exchange, exchange_type="fanout", durable=True)
        channel.queue_declare(self.dead_queue, durable=True)
        channel.queue_bind(self.dead_queue, self.dead_exchange)
        channel.exchange_declare(self.exchange, exchange_type="direct", durable=True)
        channel.queue_declare(
            self.queue, durable=True, arguments={"x-dead-letter-exchange": self.dead_exchange}
        )
        channel.queue_bind(self.queue, self.exchange, routing_key=ROUTING_KEY)


def heartbeat_seconds(amqp_url: str, lease_s: float) -> int:
    """The AMQP heartbeat timeout: the URL's `heartbeat=` if it has one, else half a lease
    within [2, 10] s.

    A frozen worker (SIGSTOP, a stalled VM) keeps the wake-ups it prefetched until the
    broker closes its connection for missed heartbeats, which RabbitMQ does two to three
    timeouts after the last frame; only then are they delivered to a live worker. Tying
    the timeout to the lease lets a takeover finish within a couple of lease periods.
    """
    given = parse_qs(urlsplit(amqp_url).query).get("heartbeat")
    if given:
        return int(given[-1])
    return max(MIN_HEARTBEAT_S, min(MAX_HEARTBEAT_S, math.ceil(lease_s / 2)))


def connect(
    amqp_url: str, name: str, heartbeat_s: int = MAX_HEARTBEAT_S
) -> pika.BlockingConnection:
    """Open a connection that identifies itself and keeps AMQP heartbeats short.

    The URL's own `heartbeat=` query parameter, when present, wins over `heartbeat_s`.
    """
    params = pika.URLParameters(amqp_url)
    if "heartbeat" not in parse_qs(urlsplit(amqp_url).query):
        params.heartbeat = heartbeat_s
    params.blocked_connection_timeout = 30
    params.socket_timeout = 5
    params.connection_attempts = 1
    params.client_properties = {"connection_name": name}
    try:
        connection = pika.BlockingConnection(params)
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
