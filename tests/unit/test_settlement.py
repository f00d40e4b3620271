"""The consumer's ack/requeue/dead-letter decision, as a pure function."""

from __future__ import annotations

import pytest

from flowforge.errors import DatabaseUnavailable
from flowforge.worker.consumer import Settlement, settlement


@pytest.mark.parametrize("redelivered", [False, True])
def test_a_handled_wake_up_is_acked(redelivered: bool) -> None:
    assert settlement(None, redelivered) is Settlement.ACK


@pytest.mark.parametrize("redelivered", [False, True])
def test_an_outage_is_handed_back_for_as_long_as_it_lasts(redelivered: bool) -> None:
    assert settlement(DatabaseUnavailable("gone"), redelivered) is Settlement.REQUEUE


def test_any_other_error_is_retried_once_then_dead_lettered() -> None:
    assert settlement(RuntimeError("bug"), redelivered=False) is Settlement.REQUEUE
    assert settlement(RuntimeError("bug"), redelivered=True) is Settlement.DEAD_LETTER
