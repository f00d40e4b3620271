"""One bounded, thread-safe cache for what a process may keep of the database's contents.

Used for immutable or re-checked values only (parsed workflow versions; intake targets,
which the intake statement verifies): a full cache is simply emptied, which bounds its
memory without any bookkeeping on the hot path.
"""

from __future__ import annotations

import threading
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

    def put(self, key: K, value: V) -> None:
        """Remember a value, emptying the cache first when it is full."""
        with self._lock:
            if len(self._values) >= self.max_entries:
                self._values.clear()
            self._values[key] = value
