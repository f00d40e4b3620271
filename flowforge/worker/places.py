"""Steps that hold a reserved place in a rate limit's schedule, woken by this worker at
that place (docs/contract.md#outbound-limits).

A step over its rate keeps a place in the key's shared schedule (store/outbound.py) and
stays `ready` with that wake time. Its wake-up used to travel timer scanner → outbox →
relay → broker → consumer, and under load it reached its claim a median 0.45 s (p90
0.9 s, up to 2.3 s) after its place; behind a backlog in the queue, seconds: a place
reached that late is a place lost (35/s for a limit of 50/s). The worker whose claim
recorded the place knows the instant, so it keeps the step here, in a heap, and hands it
to an executor thread when its place comes: no round trip through the database, the
relay or the broker, and no executor thread held while it waits.

Nothing here decides admission: the claim does, under the key's row lock, as before, so
the limit holds across the cluster whoever wakes the step. This heap is only the fast
path; the database keeps the wait. A worker that dies, stops or fails the local claim
leaves the row behind, and any worker's timer scanner wakes it through the broker once it
is LOCAL_GRACE_S overdue (outbound.WAKE_LIMITED).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial

from flowforge.errors import DatabaseUnavailable
from flowforge.worker.broker import Wakeup
from flowforge.worker.loop import Loop

logger = logging.getLogger(__name__)

# The longest this thread sleeps without looking at `stop`.
MAX_SLEEP = 1.0


class PlaceTimer(Loop):
    """A heap of (place, step): each is handed to `fire` when its place comes.

    `fire` submits the wake-up to the executor threads and returns its future (or raises
    RuntimeError once they were shut down). One entry per step: a step placed again (a
    duplicate wake-up, or placed once more at the claim) keeps only its latest place.
    """

    def __init__(
        self,
        fire: Callable[[Wakeup], Future[None]],
        taking_work: Callable[[], bool],
        stop: threading.Event,
    ) -> None:
        super().__init__("places", stop)
        self.fire = fire
        self.taking_work = taking_work
        self._heap: list[tuple[float, int, Wakeup]] = []
        self._latest: dict[tuple[str, str], int] = {}  # step -> its newest entry's number
        self._numbers = 0
        self._changed = threading.Condition()

    def add(self, wakeup: Wakeup, in_s: float) -> None:
        """Wake `wakeup` in `in_s` seconds (its place, by the database's clock, as seen at
        its claim's commit)."""
        at = time.monotonic() + max(0.0, in_s)
        with self._changed:
            self._numbers += 1
            self._latest[(wakeup.execution_id, wakeup.step_id)] = self._numbers
            heapq.heappush(self._heap, (at, self._numbers, wakeup))
            if self._heap[0][1] == self._numbers:
                self._changed.notify()

    def step(self) -> float:
        due = self._take_due()
        if not self.taking_work():
            # Draining: what is left is the database's (the scanner's fallback).
            self._drop()
            return MAX_SLEEP
        for wakeup in due:
            try:
                future = self.fire(wakeup)
            except RuntimeError:  # the executor threads were shut down: draining
                return MAX_SLEEP
            future.add_done_callback(partial(_report, wakeup))
        return 0.0

    def idle(self, seconds: float) -> bool:
        """Sleep until the earliest place, a new earlier one, or at most MAX_SLEEP (then
        look at `stop` again); after a failed pass, the loop's back-off."""
        with self._changed:
            if self._heap and seconds == 0.0:
                seconds = self._heap[0][0] - time.monotonic()
            else:
                seconds = seconds or MAX_SLEEP
            if seconds > 0 and not self.stop.is_set():
                self._changed.wait(min(seconds, MAX_SLEEP))
        return self.stop.is_set()

    def _take_due(self) -> list[Wakeup]:
        now = time.monotonic()
        due = []
        with self._changed:
            while self._heap and self._heap[0][0] <= now:
                _at, number, wakeup = heapq.heappop(self._heap)
                key = (wakeup.execution_id, wakeup.step_id)
                if self._latest.get(key) == number:
                    del self._latest[key]
                    due.append(wakeup)
        return due

    def _drop(self) -> None:
        with self._changed:
            self._heap.clear()
            self._latest.clear()


def _report(wakeup: Wakeup, future: Future[None]) -> None:
    """A local wake-up that failed is left to the timer scanner's fallback."""
    error = future.exception()
    if error is None:
        return
    log = {"execution_id": wakeup.execution_id, "step": wakeup.step_id}
    if isinstance(error, DatabaseUnavailable):
        logger.warning("local wake-up failed: database unavailable; the scanner retries", extra=log)
    else:
        logger.error("local wake-up failed; the scanner retries", extra=log, exc_info=error)
