"""Execution ids: UUIDv7, so they sort by creation time."""

from __future__ import annotations

import time

from flowforge.usecases.intake import uuid7


def test_execution_ids_are_version_7_and_time_ordered() -> None:
    first = uuid7()
    time.sleep(0.002)
    later = [uuid7() for _ in range(100)]
    assert first.version == 7 and first.variant == "specified in RFC 4122"
    assert all(first < u for u in later)
    assert len(set(later)) == 100
