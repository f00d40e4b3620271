"""One bounded, thread-safe cache for what a process may keep of the database's contents.

Used for immutable or re-checked values only (parsed workflow versions; intake targets,
which the intake statement verifies): a full cache is simply emptied, which bounds its
memory without any bookkeeping on the hot path. Rechecks throttles the re-reads a failed
signature verification asks for (docs/reference/security.md, "Forged signatures").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """At most `max_entries` values; forgets them all when a new one would not fit."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._values: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        """The cached value, or None."""
        with self._lock:
            return self._values.get(key)

    def discard(self, key: K) -> None:
        """Forget one value (the database changed under it)."""
        with self._lock:
            self._values.pop(key, None)

    def put(self, key: K, value: V) -> None:
        """Remember a value, emptying the cache first when it is full."""
        with self._lock:
            if len(self._values) >= self.max_entries:
                self._values.clear()
            self._values[key] = value


class Rechecks(Generic[K]):
    """How often a key's entry may be re-read from the database because the cache could
    not verify with it (a signature no cached secret matches): a token bucket per key of
    `burst` re-reads, refilled at one per `interval_s`. A few failures (a sender who
    signed before the operator added the secret) each re-read, so a new secret verifies
    on the next request; a flood of forged signatures costs at most `burst` reads, then
    one per `interval_s`, per key — and a secret added during such a flood is seen
    within `interval_s`.

    Only keys that exist are asked about (the caller has read them once); a full table
    is emptied, which at worst allows one more burst per key."""

    def __init__(self, interval_s: float, burst: int, max_entries: int) -> None:
        self.interval_s = interval_s
        self.burst = burst
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._buckets: dict[K, tuple[float, float]] = {}  # key -> (tokens, when)

    def allow(self, key: K) -> bool:
        """Take one re-read for `key` if its bucket has one."""
        now = time.monotonic()
        with self._lock:
            tokens, when = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - when) / self.interval_s)
            if len(self._buckets) >= self.max_entries and key not in self._buckets:
                self._buckets.clear()
            if tokens < 1:
                self._buckets[key] = (tokens, now)
                return False
            self._buckets[key] = (tokens - 1, now)
            return True
