"""Sampling a frozen process's sessions for locks no server timeout covers (issue 39,
docs/contract.md#frozen-processes).

pg_stat_activity is a snapshot of every backend's state taken once per transaction (its
wait_event is read live), and pg_locks is read when it is scanned: one query joining them
can see a session's old state beside its new locks. A session of a frozen client still
runs what reached the server before the stop — a round trip that waited for a row lock
finishes when the lock is free — and a sample that lands on that moment reports a session
`idle` (or `active`, ClientRead) holding locks it holds only on its way between two
states (tests/faults/test_random_freezes.py shows it on a session no one freezes). A
session the client really left in such a state keeps it, unchanged, for as long as the
client stays stopped: so a finding counts only when a second sample, taken a moment
later in a transaction of its own, finds the same session in the same state since the
same instant.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# How long after a finding the second sample looks again: longer than the sampling query
# takes, short beside any freeze.
AGAIN_AFTER_S = 0.1


def confirmed(sample: Callable[[], list[Any]], again_after_s: float = AGAIN_AFTER_S) -> list[Any]:
    """The rows of `sample()` found again, unchanged, by a second call `again_after_s`
    later. Each row starts with (pid, state, state_change): the identity of a session's
    state. The caller keeps the sampled process stopped across both calls."""
    first = sample()
    if not first:
        return []
    time.sleep(again_after_s)
    again = {tuple(row[:3]) for row in sample()}
    return [row for row in first if tuple(row[:3]) in again]
