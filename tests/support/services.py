"""Finding PostgreSQL and RabbitMQ for the tests: given URLs, local services, or
testcontainers where Docker answers. Under CI=true a missing service fails the run."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

import pika
import psycopg
import pytest

from tests.support.faultproxy import FaultProxy

LOCAL_DATABASE = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"


def _docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _postgres_reachable(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def amqp_answers(url: str, timeout: float = 3) -> bool:
    """A broker at `url` takes an AMQP connection within `timeout` seconds."""
    try:
        params = pika.URLParameters(url)
        params.socket_timeout = timeout
        params.connection_attempts = 1
        pika.BlockingConnection(params).close()
        return True
    except Exception:
        return False


def unavailable(what: str) -> None:
    """Skip locally, fail under CI: a green CI must never hide a missing service."""
    message = f"{what} is not available"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (CI=true: failing instead of skipping)", pytrace=False)
    pytest.skip(message)


def find_postgres(cleanups: list[Callable[[], None]]) -> str:
    """An admin URL of a PostgreSQL server the tests may create databases on."""
    url = os.environ.get("FLOWFORGE_TEST_DATABASE_URL") or LOCAL_DATABASE
    if _postgres_reachable(url):
        return url
    if not os.environ.get("FLOWFORGE_TEST_DATABASE_URL") and _docker_answers():
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:15", driver=None).start()
        cleanups.append(container.stop)
        return container.get_connection_url()
    unavailable(f"PostgreSQL ({url})")
    raise AssertionError("unreachable")


def find_rabbitmq(cleanups: list[Callable[[], None]]) -> str:
    """An AMQP URL; tests isolate themselves with their own name prefix."""
    url = os.environ.get("FLOWFORGE_TEST_AMQP_URL") or LOCAL_AMQP
    if amqp_answers(url):
        return url
    if not os.environ.get("FLOWFORGE_TEST_AMQP_URL") and _docker_answers():
        from testcontainers.rabbitmq import RabbitMqContainer

        container = RabbitMqContainer("rabbitmq:3.13").start()
        cleanups.append(container.stop)
        params = container.get_connection_params()
        return f"amqp://guest:guest@{params.host}:{params.port}/%2F"
    unavailable(f"RabbitMQ ({url})")
    raise AssertionError("unreachable")


def through_proxy(database_url: str, proxy: FaultProxy) -> str:
    """`database_url` with its host and port replaced by a FaultProxy's, as a conninfo
    (the URL may be given in either form, FLOWFORGE_TEST_DATABASE_URL included)."""
    return psycopg.conninfo.make_conninfo(database_url, host="127.0.0.1", port=proxy.port)
