"""Fixtures of the fault tests: an API client, and a fault proxy in front of RabbitMQ."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.api import Api
from tests.support.faultproxy import FaultProxy


@pytest.fixture
def client(api: str, api_key: str) -> Api:
    """The real bin/api, driven over HTTP with an API key."""
    return Api(api, api_key)


@pytest.fixture
def broker_proxy(amqp_url: str) -> Iterator[FaultProxy]:
    """A FaultProxy in front of RabbitMQ: start workers with
    FLOWFORGE_AMQP_URL=broker_proxy.url(amqp_url) to put it between them and the broker."""
    proxy = FaultProxy.for_url(amqp_url)
    yield proxy
    proxy.close()
