"""Fixtures of the fault tests: an API client, and fault proxies in front of RabbitMQ and
PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.faultproxy import FaultProxy
from tests.support.processes import start_api


@pytest.fixture
def broker_proxy(amqp_url: str) -> Iterator[FaultProxy]:
    """A FaultProxy in front of RabbitMQ: start workers with
    FLOWFORGE_AMQP_URL=broker_proxy.url(amqp_url) to put it between them and the broker."""
    proxy = FaultProxy.for_url(amqp_url)
    yield proxy
    proxy.close()


@pytest.fixture
def pg_proxy(database_url: str) -> Iterator[FaultProxy]:
    """A FaultProxy in front of this test's PostgreSQL: give a process
    `services.through_proxy(database_url, pg_proxy)` to put it in between."""
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    proxy = FaultProxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    yield proxy
    proxy.close()


@pytest.fixture
def api4(env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """bin/api with four gunicorn workers: parallel requests really land in different
    processes, and several can wait out a database pool timeout at the same time."""
    proc, base = start_api(env, tmp_path / "api4.log", workers=4)
    yield base
    proc.stop()
