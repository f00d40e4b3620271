"""A wake-up says when it was queued, and the queue's head is known only while
deliveries arrive (broker.QueueHead; issue 39: a backlog does not multiply wake-ups)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from flowforge.worker.broker import QueueHead, Wakeup

EID = "01a2515b-b9fa-7f64-bd66-ec1c8bb68255"
AT = datetime(2026, 12, 7, 16, 0, tzinfo=UTC)


def test_a_wakeup_carries_when_it_was_queued() -> None:
    assert Wakeup.decode(Wakeup(EID, "a", AT).encode()) == Wakeup(EID, "a", AT)


@pytest.mark.parametrize("queued_at", [None, 7, "yesterday", "2026-12-07T16:00:00"])
def test_a_wakeup_without_a_readable_aware_time_is_still_a_wakeup(queued_at: object) -> None:
    body = f'{{"execution_id": "{EID}", "step_id": "a", "queued_at": {queued_at!r}}}'
    body = body.replace("'", '"').replace("None", "null")
    assert Wakeup.decode(body.encode()) == Wakeup(EID, "a")


def test_the_head_is_the_latest_queued_time_and_expires() -> None:
    head = QueueHead()
    assert head.reached(10) is None
    head.saw(Wakeup(EID, "a", AT + timedelta(seconds=5)))
    head.saw(Wakeup(EID, "b", AT))  # a redelivery of an older one
    head.saw(Wakeup(EID, "c"))  # an older relay's message says nothing
    assert head.reached(10) == AT + timedelta(seconds=5)
    time.sleep(0.05)
    assert head.reached(0.01) is None
