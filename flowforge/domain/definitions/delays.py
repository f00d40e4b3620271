"""A delay step's own fields: `duration_s` or `until`, and `until` as an instant FlowForge
can store (checked at publish for a literal, at run time for a template)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flowforge.domain.definitions.bounds import EARLIEST_INSTANT, LATEST_INSTANT, MAX_DELAY_S
from flowforge.domain.definitions.checker import Checker
from flowforge.domain.jsonvalues import is_number


class DelaySection(Checker):
    """`duration_s` and `until`."""

    def delay(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> tuple[float | None, str | None]:
        """Check that a delay names exactly one way to wait."""
        duration_s: Any = raw.get("duration_s")
        until: Any = raw.get("until")
        if ("duration_s" in raw) == ("until" in raw):
            self.error(path, "a delay needs exactly one of duration_s and until")
        elif "duration_s" in raw:
            if not is_number(duration_s) or not 0 <= duration_s <= MAX_DELAY_S:
                self.error(
                    f"{path}.duration_s",
                    f"duration_s must be a number from 0 to {MAX_DELAY_S} (a year)",
                )
        elif not isinstance(until, str):
            self.error(f"{path}.until", "until must be an ISO-8601 timestamp or a template")
        elif "{{" in until or "}}" in until:
            self.templates(until, f"{path}.until", ancestors, secrets=False)
        elif not _is_aware_timestamp(until):
            self.error(f"{path}.until", "until must be an ISO-8601 timestamp with a timezone")
        elif not self.stored:
            try:
                parse_until(until)
            except ValueError as exc:
                self.error(f"{path}.until", str(exc))
        return duration_s, until


def _is_aware_timestamp(text: str) -> bool:
    """Accept only instants: a timestamp without a timezone means a different time per host."""
    try:
        return datetime.fromisoformat(text).tzinfo is not None
    except ValueError:
        return False


def parse_until(text: str) -> datetime:
    """A delay's `until` as an aware instant FlowForge can store; ValueError saying why not."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"until {text!r} is not an ISO-8601 timestamp (years 0001 to 9999)"
        ) from None
    if moment.tzinfo is None:
        raise ValueError(f"until {text!r} has no timezone")
    try:
        in_utc = moment.astimezone(UTC)
    except OverflowError:
        in_utc = None
    if in_utc is None or not EARLIEST_INSTANT <= in_utc <= LATEST_INSTANT:
        raise ValueError(
            f"until {text!r} is outside the instants FlowForge can store: it must be "
            f"between {EARLIEST_INSTANT.date()} and {LATEST_INSTANT.date()} (UTC)"
        )
    return moment
