"""The AMQP heartbeat timeout follows the lease, so a frozen worker's prefetched wake-ups
come back within a couple of lease periods; an explicit `heartbeat=` in the URL wins."""

from __future__ import annotations

from flowforge.worker.broker import heartbeat_seconds

URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def test_half_a_lease_within_two_and_ten_seconds() -> None:
    assert heartbeat_seconds(URL, 2.0) == 2
    assert heartbeat_seconds(URL, 7.0) == 4
    assert heartbeat_seconds(URL, 60.0) == 10
    assert heartbeat_seconds(URL, 0.5) == 2


def test_the_urls_own_heartbeat_wins() -> None:
    assert heartbeat_seconds(f"{URL}?heartbeat=3", 60.0) == 3
    assert heartbeat_seconds(f"{URL}?connection_attempts=2&heartbeat=30", 2.0) == 30
