"""The words of the domain, with no I/O: what an attempt's outcome is.

The engine, the worker, the reaper, the timer scanner, the intake and the API all speak
these words; keeping them here lets the pure engine import them without pulling in a
database driver, the HTTP client or the broker client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """The verdict on one attempt."""

    kind: str  # succeeded | retry | failed | unknown
    output: Any = None
    error: str | None = None
    http_status: int | None = None
    duration_ms: int | None = None
    retry_after_s: float | None = None

    @property
    def attempt_outcome(self) -> str:
        """The attempt row's outcome: a retry is a failed attempt."""
        return "failed" if self.kind == "retry" else self.kind
