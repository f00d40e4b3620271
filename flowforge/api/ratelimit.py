"""A per-process token bucket per workflow key for webhooks: a flood answers 429 with
Retry-After before any database work, so it cannot starve /healthz or other workflows.

Each gunicorn process keeps its own buckets; the effective limit of a deployment is the
configured rate times the number of API processes.
"""

from __future__ import annotations

import math
import threading
import time


class RateLimiter:
    """Allows `rate` requests per second per key, with bursts up to `burst`."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}

    def retry_after(self, key: str, now: float | None = None) -> int | None:
        """Take a token; None when allowed, else whole seconds until one is free."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1:
                self._buckets[key] = (tokens - 1, now)
                return None
            self._buckets[key] = (tokens, now)
            return max(1, math.ceil((1 - tokens) / self.rate))
