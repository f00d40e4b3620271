"""Who owns a limit and its bounds (docs/reference/security.md, "Who owns a limit"), and
how a Retry-After is read (docs/contract.md, "Outbound limits"): pure decisions, with the
clocks given."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from email.utils import formatdate
from typing import Any

import pytest

from flowforge.domain.definitions import (
    MAX_HOLD_S,
    MIN_LIMIT_RATE,
    DefinitionInvalid,
    LimitSpec,
    parse_definition,
)
from flowforge.steps.netguard import retry_after
from flowforge.store import outbound
from flowforge.store.config import ConfigError, Settings
from tests.unit.test_outbound_rules import definition


@pytest.mark.parametrize("target_clock", [0.0, -3600.0, 3600.0, -86_400 * 400])
def test_a_dated_retry_after_is_read_against_the_responses_date(target_clock: float) -> None:
    # Whatever the target's clock says (an hour behind or ahead of this machine's, or a
    # year off), 30 s after its own Date is 30 s: this machine's clock decides nothing.
    sent = time.time() + target_clock
    assert retry_after(formatdate(sent + 30, usegmt=True), formatdate(sent, usegmt=True)) == 30


def test_a_dated_retry_after_without_a_usable_date_is_left_to_the_database_clock() -> None:
    value = "Wed, 21 Oct 2037 07:28:00 GMT"
    at = datetime(2037, 10, 21, 7, 28, tzinfo=UTC)
    assert retry_after(value, None) == at
    assert retry_after(value, "yesterday") == at


@pytest.mark.parametrize(
    ("value", "date", "seconds"),
    [
        ("120", None, 120.0),
        (" 7 ", "Wed, 21 Oct 2037 07:28:00 GMT", 7.0),
        ("9999999999", None, 9999999999.0),  # held for at most MAX_HOLD_S (outbound.hold)
        ("Wed, 21 Oct 2037 07:28:00 GMT", "Wed, 21 Oct 2037 07:29:00 GMT", 0.0),
        ("soon", None, None),
        ("-5", None, None),
        (None, "Wed, 21 Oct 2037 07:28:00 GMT", None),
    ],
)
def test_retry_after_forms(value: str | None, date: str | None, seconds: float | None) -> None:
    assert retry_after(value, date) == seconds


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"rate_per_s": 1e-9}, "rate_per_s"),
        ({"rate_per_s": MIN_LIMIT_RATE * 0.99}, "rate_per_s"),
        ({"rate_per_s": 1, "burst": 0}, "burst"),
        ({"concurrency": 1, "max_hold_s": MAX_HOLD_S + 1}, "max_hold_s"),
        ({"concurrency": 1, "max_hold_s": -1}, "max_hold_s"),
        ({"shared": "acct", "rate_per_s": 5}, ""),
        ({"shared": "bad name"}, "shared"),
    ],
)
def test_a_limit_out_of_bounds_is_refused(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(DefinitionInvalid) as refused:
        parse_definition(definition({"partner": spec}))
    where = "$.limits.partner" + (f".{field}" if field else "")
    assert where in [e["path"] for e in refused.value.errors], refused.value.errors


def test_a_templated_name_cannot_stand_for_a_shared_limit() -> None:
    with pytest.raises(DefinitionInvalid):
        parse_definition(definition({"{{input.t}}": {"shared": "acct"}}, "{{input.t}}"))


def test_limits_at_their_bounds_and_a_shared_one_are_accepted() -> None:
    limits = {
        "slow": {"rate_per_s": MIN_LIMIT_RATE, "max_hold_s": 0},
        "partner": {"shared": "acct"},
    }
    parsed = parse_definition(definition(limits))
    assert parsed.limits["slow"].max_hold_s == 0
    assert parsed.limits["partner"] == LimitSpec(shared="acct")


def test_a_stored_version_from_before_the_bound_still_loads_at_the_bound() -> None:
    parsed = parse_definition(definition({"partner": {"rate_per_s": 1e-9}}), stored=True)
    assert parsed.limits["partner"].rate_per_s == MIN_LIMIT_RATE


def test_a_label_never_lets_a_name_pass_for_the_operators() -> None:
    own = outbound.LimitKey("7", "host:api.example.com")
    theirs = outbound.LimitKey(outbound.HOST, "api.example.com")
    assert own != theirs and own.label == theirs.label  # shown alike, stored apart
    assert own.params() == {"owner": "7", "key": "host:api.example.com"}


def test_operators_declare_shared_limits_for_named_workflows() -> None:
    raw = '{"acct": {"rate_per_s": 25, "burst": 5, "workflows": ["billing", "refunds"]}}'
    settings = Settings.from_env({"FLOWFORGE_SHARED_LIMITS": raw})
    shared = settings.shared_limits["acct"]
    assert shared.spec == LimitSpec(rate_per_s=25.0, burst=5)
    assert shared.workflows == {"billing", "refunds"}


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("FLOWFORGE_OUTBOUND_LIMITS", '{"h": {"rate_per_s": 1e-9}}'),
        ("FLOWFORGE_OUTBOUND_LIMITS", '{"h": {"concurrency": 1, "max_hold_s": 86400}}'),
        ("FLOWFORGE_SHARED_LIMITS", '{"acct": {"rate_per_s": 5}}'),
        ("FLOWFORGE_SHARED_LIMITS", '{"acct": {"rate_per_s": 1e-9, "workflows": []}}'),
        ("FLOWFORGE_SHARED_LIMITS", '{"a b": {"rate_per_s": 5, "workflows": []}}'),
    ],
)
def test_an_operators_limit_out_of_bounds_stops_start_up(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: raw})
