"""A per-process token bucket per workflow key for webhooks: a flood answers 429 with
Retry-After before any database work, so it cannot starve /healthz or other workflows.

Each gunicorn process keeps its own buckets; the effective limit of a deployment is the
configured rate times the number of API processes.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict


class RateLimiter:
    """Allows `rate` requests per second per key, with bursts up to `burst`.

    Keys come from URLs, so anyone can make up new ones: at most `max_keys` buckets are
    kept, least recently used first out. A bucket that has refilled is the same as no
    bucket, so those go first; only a flood of more than `max_keys` keys busy at once
    forgets a partly drained bucket (which then starts full again)."""

    def __init__(self, rate: float, burst: float, max_keys: int = 10_000) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._lock = threading.Lock()
        # key -> (tokens, last update); ordered from least to most recently used.
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._buckets)

    def retry_after(self, key: str, now: float | None = None) -> int | None:
        """Take a token; None when allowed, else whole seconds until one is free."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            self._make_room(now)
            if tokens >= 1:
                self._buckets[key] = (tokens - 1, now)
                return None
            self._buckets[key] = (tokens, now)
            return max(1, math.ceil((1 - tokens) / self.rate))

    def _make_room(self, now: float) -> None:
        """Drop refilled buckets from the old end, then the oldest ones beyond the cap."""
        while self._buckets:
            oldest, (tokens, last) = next(iter(self._buckets.items()))
            refilled = tokens + (now - last) * self.rate >= self.burst
            if not refilled and len(self._buckets) < self.max_keys:
                return
            del self._buckets[oldest]
