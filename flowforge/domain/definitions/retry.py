"""A step's `retry` policy (docs/contract.md#on-exhausted): bounds that keep back-off finite
and sane."""

from __future__ import annotations

from typing import Any

from flowforge.domain.definitions.bounds import (
    MAX_ATTEMPTS,
    MAX_BACKOFF_COEFFICIENT,
    MAX_INITIAL_INTERVAL_S,
    MAX_RETRY_INTERVAL_S,
    MIN_BACKOFF_COEFFICIENT,
)
from flowforge.domain.definitions.checker import Checker, is_whole
from flowforge.domain.definitions.shapes import RetryPolicy
from flowforge.domain.jsonvalues import is_number


class RetrySection(Checker):
    """`retry`."""

    def retry(self, retry: Any, path: str) -> RetryPolicy:
        """Check a retry policy, whose bounds keep back-off finite and sane."""
        if not isinstance(retry, dict):
            self.error(path, "retry must be an object")
            return RetryPolicy()
        default = RetryPolicy()
        self.unknown_keys(retry, set(RetryPolicy.__dataclass_fields__), path)
        attempts = retry.get("max_attempts", default.max_attempts)
        if not is_whole(attempts) or not 1 <= attempts <= MAX_ATTEMPTS:
            self.error(
                f"{path}.max_attempts", f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS}"
            )
        initial = retry.get("initial_interval_s", default.initial_interval_s)
        if not is_number(initial) or not 0 < initial <= MAX_INITIAL_INTERVAL_S:
            self.error(
                f"{path}.initial_interval_s",
                f"initial_interval_s must be in (0, {MAX_INITIAL_INTERVAL_S}]",
            )
        coefficient = retry.get("backoff_coefficient", default.backoff_coefficient)
        if (
            not is_number(coefficient)
            or not MIN_BACKOFF_COEFFICIENT <= coefficient <= MAX_BACKOFF_COEFFICIENT
        ):
            self.error(
                f"{path}.backoff_coefficient",
                f"backoff_coefficient must be in [{MIN_BACKOFF_COEFFICIENT}, "
                f"{MAX_BACKOFF_COEFFICIENT}]",
            )
        maximum = retry.get("max_interval_s", default.max_interval_s)
        if not is_number(maximum) or not maximum <= MAX_RETRY_INTERVAL_S:
            self.error(
                f"{path}.max_interval_s",
                f"max_interval_s must be a number up to {MAX_RETRY_INTERVAL_S}",
            )
        elif is_number(initial) and maximum < initial:
            self.error(f"{path}.max_interval_s", "max_interval_s must be >= initial_interval_s")
        on_exhausted = self.choice(
            retry,
            "on_exhausted",
            default.on_exhausted,
            path,
            'on_exhausted must be "fail" or "pause"',
        )
        return RetryPolicy(attempts, initial, coefficient, maximum, on_exhausted)
