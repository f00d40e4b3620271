"""Five-field cron expressions and when they fire, with the DST rule of docs/contract.md#schedules.

Standard (Vixie/Debian cron) semantics: minute hour day-of-month month day-of-week;
`*`, numbers, ranges `a-b`, steps `*/n`, `a-b/n` and `a/n` (from a to the field's end),
lists `a,b`, month names JAN-DEC and day names SUN-SAT (case-insensitive), day-of-week 0-7
with 0 and 7 both Sunday. When both day fields are restricted a day matches either (the
OR rule); when either starts with `*` both must match.

Expressions are matched against the wall clock of the schedule's zone. A wall-clock time
the zone skips (spring forward) fires at the next valid instant, the jump itself; one the
zone repeats (fall back) fires once, at its first occurrence. Written here rather than
taken from a library so this rule is ours, tested, and the same for every expression.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# The fields in order: name, lowest and highest value, the names that stand for values.
FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day-of-month", 1, 31, ()),
    ("month", 1, 12, MONTHS),
    ("day-of-week", 0, 7, DAYS),
)
# The longest day of each month (February in a leap year).
LONGEST_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# How far ahead a search looks before it says the expression fires no more (a Feb 29 that
# must also be a given weekday comes back within 28 years).
SEARCH_YEARS = 30
MINUTE = timedelta(minutes=1)


class CronError(ValueError):
    """The text is not a five-field cron expression; the message says which part."""


@dataclass(frozen=True)
class Cron:
    """A parsed expression: the values each field allows."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday … 6 = Saturday
    day_or: bool  # both day fields restricted: a day matches either

    def next_after(self, after: datetime, zone: ZoneInfo) -> datetime | None:
        """The first instant strictly after `after` (aware) at which this expression
        fires in `zone`, in UTC; None when it never fires again."""
        local = after.astimezone(zone).replace(tzinfo=None)
        start = local.replace(second=0, microsecond=0) + MINUTE
        while True:
            wall = self._next_wall(start)
            if wall is None:
                return None
            instant = wall_to_instant(wall, zone)
            # In a repeated hour the first occurrence may lie before `after`: it fired.
            if instant > after:
                return instant
            start = wall + MINUTE

    def day_matches(self, day: date) -> bool:
        """Whether a calendar day is one the day-of-month and day-of-week fields allow."""
        in_month = day.day in self.days
        in_week = (day.weekday() + 1) % 7 in self.weekdays
        return in_month or in_week if self.day_or else in_month and in_week

    def _next_wall(self, start: datetime) -> datetime | None:
        """The first matching wall-clock minute at or after `start` (naive)."""
        t = start
        while t.year <= start.year + SEARCH_YEARS:
            if t.month not in self.months:
                year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
                t = datetime(year, month, 1)
                continue
            if not self.day_matches(t.date()):
                t = datetime.combine(t.date() + timedelta(days=1), time())
                continue
            hour = next((h for h in self.hours if h >= t.hour), None)
            if hour is None:
                t = datetime.combine(t.date() + timedelta(days=1), time())
                continue
            if hour != t.hour:
                t = t.replace(hour=hour, minute=0)
            minute = next((m for m in self.minutes if m >= t.minute), None)
            if minute is None:
                t = t.replace(minute=0) + timedelta(hours=1)
                continue
            return t.replace(minute=minute)
        return None


def wall_to_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The UTC instant a naive wall-clock time of `zone` stands for, by the rule of
    docs/contract.md#schedules: an ambiguous time is its first occurrence; a time the zone skips is
    the instant the clock jumps (the next valid instant)."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    # A gap: fold=1 reads `wall` with the offset after the jump, fold=0 with the one
    # before, so the jump lies between the two readings. Zone transitions fall on whole
    # seconds: search the first whole second whose wall clock is past `wall`.
    low = int(wall.replace(tzinfo=zone, fold=1).timestamp())
    high = int(first.timestamp())
    low, high = min(low, high), max(low, high)
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).replace(tzinfo=None) > wall:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def parse(text: str) -> Cron:
    """Parse a five-field expression, or raise CronError saying what is wrong."""
    parts = text.split()
    if len(parts) != 5:
        raise CronError(
            f"a cron expression has five fields (minute hour day-of-month month day-of-week);"
            f" {text!r} has {len(parts)}"
        )
    values = [_field(part, *spec) for part, spec in zip(parts, FIELDS, strict=True)]
    minutes, hours, days, months, weekdays = values
    day_or = not (parts[2].startswith("*") or parts[4].startswith("*"))
    if not day_or and min(days) > max(LONGEST_MONTH[m - 1] for m in months):
        raise CronError(f"{text!r} never fires: no month it names has day {min(days)}")
    return Cron(
        text=text,
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=frozenset(days),
        months=frozenset(months),
        weekdays=frozenset(d % 7 for d in weekdays),
        day_or=day_or,
    )


def _field(text: str, name: str, low: int, high: int, names: tuple[str, ...]) -> set[int]:
    """The values one field allows."""
    values: set[int] = set()
    for term in text.split(","):
        values |= _term(term, name, low, high, names)
    return values


def _term(term: str, name: str, low: int, high: int, names: tuple[str, ...]) -> set[int]:
    """One list item: `*`, `n`, `a-b`, each optionally `/step`."""
    base, slash, step_text = term.partition("/")
    step = 1
    if slash:
        step = _number(step_text, name, 1, 10_000, ())
    if base == "*":
        first, last = low, high
    elif "-" in base:
        start_text, _, end_text = base.partition("-")
        first = _number(start_text, name, low, high, names)
        last = _number(end_text, name, low, high, names)
        if last < first:
            raise CronError(f"{name} range {base!r} ends before it starts")
    else:
        first = _number(base, name, low, high, names)
        last = high if slash else first
    return set(range(first, last + 1, step))


def _number(text: str, name: str, low: int, high: int, names: tuple[str, ...]) -> int:
    """A field value: digits or one of the field's names."""
    upper = text.upper()
    if upper in names:
        # Months count from 1, days of the week from 0 (Sunday).
        return names.index(upper) + (1 if names is MONTHS else 0)
    if not text.isascii() or not text.isdigit():
        raise CronError(
            f"{name} {text!r} is not a number" + (f" or a name ({names[0]}...)" if names else "")
        )
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{name} {value} is outside {low}-{high}")
    return value
