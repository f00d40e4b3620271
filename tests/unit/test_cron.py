"""Cron parsing and fire times (flowforge/domain/cron.py), checked against cronsim, and the DST
rule of docs/contract.md#schedules on the 2026 transitions of Europe/Lisbon and America/New_York.

cronsim (healthchecks.io) is the reference: it follows Debian cron, whose DST handling
for expressions with a fixed minute and hour is the rule of docs/contract.md#schedules. For
expressions with `*` in the minute or hour field it counts real time across a transition instead,
which is not our rule, so those are compared in UTC only (and in zones by the DST tests below).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

from flowforge.domain import cron
from flowforge.domain.definitions import DefinitionInvalid, parse_definition

SETTINGS = settings(max_examples=200, deadline=None)
ZONES = ("UTC", "Europe/Lisbon", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe")
NAMES = {3: cron.MONTHS, 4: cron.DAYS}
BOUNDS = [(low, high) for _, low, high, _ in cron.FIELDS]


@st.composite
def terms(draw: Any, index: int) -> str:
    """One list item of field `index`: *, n, a-b, each maybe with a step; maybe names."""
    low, high = BOUNDS[index]

    def value() -> str:
        number = draw(st.integers(low, high))
        names = NAMES.get(index)
        if names and draw(st.booleans()) and number - (index == 3) < len(names):
            return (
                names[number - (index == 3)].lower()
                if draw(st.booleans())
                else names[number - (index == 3)]
            )
        return str(number)

    kind = draw(st.sampled_from(["star", "value", "range", "from"]))
    if kind == "star":
        base = "*"
    elif kind == "value":
        base = value()
    elif kind == "range":
        # a < b: cronsim reads a one-value range with a step (`0-0/1`) as `0/1`.
        a = draw(st.integers(low, high - 1))
        base = f"{a}-{draw(st.integers(a + 1, high))}"
    else:
        base = value()
    if kind == "from" or (kind != "value" and draw(st.booleans())):
        return f"{base}/{draw(st.integers(1, high + 1))}"
    return base


@st.composite
def expressions(draw: Any, fixed_time: bool = False) -> str:
    fields = []
    for index in range(5):
        if fixed_time and index < 2:
            low, high = BOUNDS[index]
            fields.append(
                ",".join(str(draw(st.integers(low, high))) for _ in range(draw(st.integers(1, 3))))
            )
            continue
        count = draw(st.integers(1, 3))
        fields.append(",".join(draw(terms(index)) for _ in range(count)))
    return " ".join(fields)


instants = st.datetimes(
    min_value=datetime(2024, 1, 1), max_value=datetime(2030, 12, 31), timezones=st.just(UTC)
)


def ours(text: str, start: datetime, zone: str, count: int) -> list[datetime] | None:
    try:
        expression = cron.parse(text)
    except cron.CronError:
        return None
    out, t = [], start
    for _ in range(count):
        nxt = expression.next_after(t, ZoneInfo(zone))
        if nxt is None:
            break
        out.append(nxt)
        t = nxt
    return out


def reference(text: str, start: datetime, zone: str, count: int) -> list[datetime] | None:
    try:
        sim = CronSim(text, start.astimezone(ZoneInfo(zone)))
    except Exception:  # cronsim raises several classes
        return None
    out: list[datetime] = []
    try:
        for _ in range(count):
            out.append(next(sim).astimezone(UTC))
    except StopIteration:
        pass
    # cronsim's first answer may equal its start (it starts at the whole second).
    return [t for t in out if t > start][:count] if out and out[0] <= start else out


@SETTINGS
@given(expressions(), instants)
def test_any_expression_fires_like_cronsim_in_utc(text: str, start: datetime) -> None:
    expected = reference(text, start, "UTC", 5)
    assert ours(text, start, "UTC", 5) == expected


@SETTINGS
@given(expressions(fixed_time=True), instants, st.sampled_from(ZONES))
def test_fixed_time_expressions_fire_like_cronsim_in_any_zone(
    text: str, start: datetime, zone: str
) -> None:
    expected = reference(text, start, zone, 4)
    got = ours(text, start, zone, 4)
    # Two wall times that a gap maps to one instant fire once (cronsim repeats it).
    assert got == (sorted(set(expected)) if expected is not None else None)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "* * * *",
        "* * * * * *",
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * 32 * *",
        "* * * 13 *",
        "* * * * 8",
        "5-1 * * * *",
        "*/0 * * * *",
        "a * * * *",
        "* * * FOO *",
        "* * L * *",
        "* * * * 1#2",
        "* * ? * *",
        "0 0 30 2 *",
        "0 0 31 4,6,9,11 *",
        "\u0661 * * * *",  # an Arabic-Indic one: isdigit() but not ASCII
    ],
)
def test_bad_expressions_are_refused(text: str) -> None:
    with pytest.raises(cron.CronError):
        cron.parse(text)


def test_the_day_fields_or_rule() -> None:
    # Both restricted: the 13th, or any Friday.
    either = cron.parse("0 0 13 * fri")
    assert either.day_matches(datetime(2026, 3, 13).date())  # a Friday the 13th
    assert either.day_matches(datetime(2026, 3, 6).date())  # a Friday
    assert either.day_matches(datetime(2026, 4, 13).date())  # a Monday the 13th
    assert not either.day_matches(datetime(2026, 4, 14).date())
    # Either starting with `*`: both must match.
    both = cron.parse("0 0 */1 * fri")
    assert not both.day_matches(datetime(2026, 4, 13).date())
    assert cron.parse("0 0 * * 7").day_matches(datetime(2026, 3, 8).date())  # 7 is Sunday


def fires(text: str, zone: str, start: datetime, count: int) -> list[str]:
    """Fire times as local ISO strings (with their offsets)."""
    expression, tz = cron.parse(text), ZoneInfo(zone)
    out, t = [], start
    for _ in range(count):
        t = expression.next_after(t, tz)  # type: ignore[assignment]
        out.append(t.astimezone(tz).isoformat())
    return out


def test_new_york_spring_forward_2026_fires_missing_times_at_the_jump_once() -> None:
    # 2026-03-08: 02:00 EST becomes 03:00 EDT; 02:00-02:59 do not exist.
    start = datetime(2026, 3, 8, 6, 0, tzinfo=UTC)  # 01:00 EST
    assert fires("*/20 * * * *", "America/New_York", start, 5) == [
        "2026-03-08T01:20:00-05:00",
        "2026-03-08T01:40:00-05:00",
        "2026-03-08T03:00:00-04:00",  # 02:00, 02:20, 02:40 fire once, at the jump
        "2026-03-08T03:20:00-04:00",
        "2026-03-08T03:40:00-04:00",
    ]
    assert fires("30 2 * * *", "America/New_York", start, 2) == [
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
    ]


def test_new_york_fall_back_2026_fires_repeated_times_once_at_the_first() -> None:
    # 2026-11-01: 02:00 EDT becomes 01:00 EST; 01:00-01:59 happen twice.
    start = datetime(2026, 11, 1, 4, 30, tzinfo=UTC)  # 00:30 EDT
    assert fires("0,30 * * * *", "America/New_York", start, 4) == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:30:00-04:00",
        "2026-11-01T02:00:00-05:00",  # the second 01:00 and 01:30 do not fire
        "2026-11-01T02:30:00-05:00",
    ]
    assert fires("30 1 * * *", "America/New_York", start, 2) == [
        "2026-11-01T01:30:00-04:00",
        "2026-11-02T01:30:00-05:00",
    ]
    # Asked from inside the second 01:xx, the repeated times are past: next is 02:00.
    second = datetime(2026, 11, 1, 6, 10, tzinfo=UTC)  # 01:10 EST
    assert fires("*/15 * * * *", "America/New_York", second, 1) == ["2026-11-01T02:00:00-05:00"]


def test_lisbon_2026_transitions() -> None:
    lisbon = "Europe/Lisbon"
    # 2026-03-29: 01:00 WET becomes 02:00 WEST.
    assert fires("30 1 * * *", lisbon, datetime(2026, 3, 28, 12, tzinfo=UTC), 2) == [
        "2026-03-29T02:00:00+01:00",
        "2026-03-30T01:30:00+01:00",
    ]
    # 2026-10-25: 02:00 WEST becomes 01:00 WET.
    assert fires("30 1 * * *", lisbon, datetime(2026, 10, 24, 12, tzinfo=UTC), 2) == [
        "2026-10-25T01:30:00+01:00",
        "2026-10-26T01:30:00+00:00",
    ]
    assert fires("*/30 1 * * *", lisbon, datetime(2026, 10, 24, 23, 50, tzinfo=UTC), 3) == [
        "2026-10-25T01:00:00+01:00",
        "2026-10-25T01:30:00+01:00",
        "2026-10-26T01:00:00+00:00",
    ]


def test_every_s_ticks_on_multiples_of_the_interval_since_the_epoch() -> None:
    definition = parse_definition(
        {
            "name": "tick",
            "trigger": {"schedule": {"every_s": 60, "timezone": "Asia/Kolkata"}},
            "steps": [{"id": "a", "type": "transform", "output": 1}],
        }
    )
    schedule = definition.schedule
    assert schedule is not None and schedule.overlap == "skip"
    at = datetime(2026, 12, 1, 12, 0, 30, 500, tzinfo=UTC)
    assert schedule.next_after(at) == datetime(2026, 12, 1, 12, 1, tzinfo=UTC)
    assert schedule.next_after(datetime(2026, 12, 1, 12, 1, tzinfo=UTC)) == at.replace(
        minute=2, second=0, microsecond=0
    )
    assert schedule.next_after(at - timedelta(days=1)) == datetime(2026, 11, 30, 12, 1, tzinfo=UTC)


def _with(schedule: Any, webhook: bool = True) -> dict[str, Any]:
    trigger: dict[str, Any] = {"schedule": schedule}
    if webhook:
        trigger["webhook"] = {"auth": "none"}
    return {
        "name": "s",
        "trigger": trigger,
        "steps": [{"id": "a", "type": "transform", "output": 1}],
    }


def test_a_schedule_and_a_webhook_together() -> None:
    definition = parse_definition(
        _with(
            {
                "cron": "*/5 * * * *",
                "timezone": "Europe/Lisbon",
                "overlap": "buffer_one",
                "catchup_window_s": 3600,
                "jitter_s": 2.5,
                "input": {"kind": "sweep"},
            }
        )
    )
    assert definition.webhook_auth == "none"
    schedule = definition.schedule
    assert schedule is not None and schedule.cron is not None
    assert (schedule.timezone, schedule.overlap, schedule.input) == (
        "Europe/Lisbon",
        "buffer_one",
        {"kind": "sweep"},
    )


@pytest.mark.parametrize(
    ("schedule", "path"),
    [
        ({}, "$.trigger.schedule"),
        ({"cron": "* * * * *", "every_s": 5}, "$.trigger.schedule"),
        ({"cron": "* * * *"}, "$.trigger.schedule.cron"),
        ({"cron": 5}, "$.trigger.schedule.cron"),
        ({"every_s": 0}, "$.trigger.schedule.every_s"),
        ({"every_s": 1.5}, "$.trigger.schedule.every_s"),
        ({"every_s": True}, "$.trigger.schedule.every_s"),
        ({"every_s": 5, "timezone": "Mars/Olympus"}, "$.trigger.schedule.timezone"),
        ({"every_s": 5, "timezone": "../../etc/passwd"}, "$.trigger.schedule.timezone"),
        ({"every_s": 5, "timezone": ""}, "$.trigger.schedule.timezone"),
        ({"every_s": 5, "overlap": "queue"}, "$.trigger.schedule.overlap"),
        ({"every_s": 5, "catchup_window_s": 0}, "$.trigger.schedule.catchup_window_s"),
        ({"every_s": 5, "jitter_s": -1}, "$.trigger.schedule.jitter_s"),
        ({"every_s": 5, "jitter_s": 3601}, "$.trigger.schedule.jitter_s"),
        ({"every_s": 5, "input": [1]}, "$.trigger.schedule.input"),
        ({"every_s": 5, "when": "now"}, "$.trigger.schedule.when"),
        ("hourly", "$.trigger.schedule"),
    ],
)
def test_bad_schedules_are_422_at_their_path(schedule: Any, path: str) -> None:
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition(_with(schedule, webhook=False))
    assert caught.value.status == 422
    assert path in [error["path"] for error in caught.value.errors]
