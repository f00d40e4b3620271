"""Ports of the servers a test stops and starts again (tests/support/own_servers.py): a
port inside the kernel's ephemeral range can be handed to any outgoing connection while
its server is down, and the restart then fails with eaddrinuse (seed 2334: the run's own
RabbitMQ never came back, 592 executions left unsettled)."""

from __future__ import annotations

import socket

from tests.support.processes import _ephemeral_range, free_port, server_port


def test_a_server_port_is_outside_the_ephemeral_range_and_free() -> None:
    low, high = _ephemeral_range()
    for _ in range(20):
        port = server_port()
        assert not low <= port <= high
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_port_is_inside_it_which_is_why_restarted_servers_do_not_use_it() -> None:
    low, high = _ephemeral_range()
    assert low <= free_port() <= high
