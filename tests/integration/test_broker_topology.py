"""Queue type and several broker URLs (issue 26), on the shared RabbitMQ with this test's
own names. A queue already declared with the other type is used as it is (with a
warning) instead of a 406 on every declare; a list of URLs fails over past a dead node."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from flowforge.worker.broker import Topology, broker_urls, connect, heartbeat_seconds
from tests.support.api import Api
from tests.support.definitions import transform, unsigned
from tests.support.processes import free_port


def _queue_type(queue: str) -> str:
    """What the broker says the queue is (read-only: rabbitmqctl list_queues)."""
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "name", "type", "--no-table-headers"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    types = dict(line.split("\t")[:2] for line in listed.splitlines() if "\t" in line)
    return types[queue]


def test_new_queues_are_quorum_by_default(amqp_url: str, amqp_prefix: str) -> None:
    conn = connect(amqp_url, "test")
    try:
        Topology(amqp_prefix).declare(conn.channel())
    finally:
        conn.close()
    assert _queue_type(f"{amqp_prefix}.steps") == "quorum"
    assert _queue_type(f"{amqp_prefix}.dead") == "quorum"


@pytest.mark.parametrize(("existing", "configured"), [("classic", "quorum"), ("quorum", "classic")])
def test_a_queue_of_the_other_type_is_used_as_it_is(
    amqp_url: str,
    amqp_prefix: str,
    existing: str,
    configured: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn = connect(amqp_url, "test")
    try:
        Topology(amqp_prefix, existing).declare(conn.channel())
        with caplog.at_level(logging.WARNING):
            channel = Topology(amqp_prefix, configured).declare(conn.channel())
            channel.basic_publish(amqp_prefix, "step", b"{}")  # the channel works
            # And again: every later declare succeeds too, no 406 loop.
            Topology(amqp_prefix, configured).declare(conn.channel())
    finally:
        conn.close()
    assert _queue_type(f"{amqp_prefix}.steps") == existing
    assert "exists with another type" in caplog.text


def test_a_worker_runs_on_a_classic_queue_an_operator_declared(
    amqp_url: str, amqp_prefix: str, api: str, api_key: str, workers, tmp_path: Path
) -> None:
    conn = connect(amqp_url, "test")
    try:
        Topology(amqp_prefix, "classic").declare(conn.channel())
    finally:
        conn.close()
    worker = workers()
    client = Api(api, api_key)
    client.publish("t", unsigned([transform("a", {"x": 1})]))
    done = client.wait(client.start("t", {}))
    assert done["status"] == "succeeded"
    assert "exists with another type" in worker.log()


def test_several_urls_fail_over_past_a_dead_node(amqp_url: str) -> None:
    dead = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"
    urls = f"{dead}, {amqp_url}"
    assert broker_urls(urls) == [dead, amqp_url]
    for _ in range(6):  # shuffled: the dead one comes first about half the time
        conn = connect(urls, "test")
        assert conn.is_open
        conn.close()
    assert heartbeat_seconds(f"{dead}?heartbeat=7,{amqp_url}", 60) == 7
