"""`trigger.schedule` (docs/contract.md#schedules): when a workflow runs by itself."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flowforge.domain import cron
from flowforge.domain.definitions.bounds import (
    DEFAULT_CATCHUP_WINDOW_S,
    MAX_CATCHUP_WINDOW_S,
    MAX_EVERY_S,
    MAX_JITTER_S,
)
from flowforge.domain.definitions.checker import Checker, is_whole
from flowforge.domain.definitions.shapes import OVERLAP, Schedule
from flowforge.domain.jsonvalues import is_number
from flowforge.domain.model import Overlap

_SCHEDULE_KEYS = frozenset(
    {"cron", "every_s", "timezone", "overlap", "catchup_window_s", "jitter_s", "input"}
)


def _is_zone(name: Any) -> bool:
    """Whether name is a zone the system's tz database knows (no paths, no empty names)."""
    if not isinstance(name, str) or not 0 < len(name) <= 64 or "\x00" in name:
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


class ScheduleSection(Checker):
    """`trigger.schedule`."""

    def schedule(self, doc: dict[str, Any]) -> Schedule | None:
        """Check `trigger.schedule` (docs/contract.md#schedules): exactly one of cron and every_s, a
        zone the system's tz database knows, a known overlap policy, bounded windows, object
        input."""
        trigger = doc.get("trigger")
        if not isinstance(trigger, dict) or "schedule" not in trigger:
            return None
        raw = trigger["schedule"]
        path = "$.trigger.schedule"
        if not isinstance(raw, dict):
            self.error(path, "schedule must be an object with cron or every_s")
            return None
        before = len(self.errors)
        self.unknown_keys(raw, _SCHEDULE_KEYS, path)
        expression: cron.Cron | None = None
        every_s: Any = raw.get("every_s")
        if ("cron" in raw) == ("every_s" in raw):
            self.error(path, "a schedule needs exactly one of cron and every_s")
        elif "cron" in raw:
            if not isinstance(raw["cron"], str):
                self.error(f"{path}.cron", "cron must be a string of five fields")
            else:
                try:
                    expression = cron.parse(raw["cron"])
                except cron.CronError as exc:
                    self.error(f"{path}.cron", str(exc))
        elif not is_whole(every_s) or not 1 <= every_s <= MAX_EVERY_S:
            self.error(f"{path}.every_s", f"every_s must be whole seconds from 1 to {MAX_EVERY_S}")
        zone: Any = raw.get("timezone", "UTC")
        if not _is_zone(zone):
            self.error(f"{path}.timezone", "timezone must be an IANA name such as Europe/Lisbon")
        overlap = raw.get("overlap", "skip")
        if overlap not in OVERLAP:
            self.error(f"{path}.overlap", f"overlap must be one of {', '.join(OVERLAP)}")
        window: Any = raw.get("catchup_window_s", DEFAULT_CATCHUP_WINDOW_S)
        if not is_number(window) or not 1 <= window <= MAX_CATCHUP_WINDOW_S:
            self.error(
                f"{path}.catchup_window_s",
                f"catchup_window_s must be seconds from 1 to {MAX_CATCHUP_WINDOW_S}",
            )
        jitter: Any = raw.get("jitter_s", 0)
        if not is_number(jitter) or not 0 <= jitter <= MAX_JITTER_S:
            self.error(f"{path}.jitter_s", f"jitter_s must be seconds from 0 to {MAX_JITTER_S}")
        given: Any = raw.get("input", {})
        if not isinstance(given, dict):
            self.error(f"{path}.input", "input must be a JSON object (scheduled_at is added)")
        if len(self.errors) > before:
            return None
        return Schedule(
            cron=expression,
            every_s=every_s if expression is None else None,
            timezone=zone,
            overlap=Overlap(overlap),
            catchup_window_s=float(window),
            jitter_s=float(jitter),
            input=given,
        )
