"""FLOWFORGE_IDEMPOTENCY_KEY_HOURS: how long webhook idempotency keys are remembered
(docs/contract.md#idempotency, docs/contract.md#retention), a number of hours from 1 to 87600,
default 24; anything else stops start-up with a message naming the variable and the range."""

from __future__ import annotations

import pytest

from flowforge.store.config import ConfigError, Settings

NAME = "FLOWFORGE_IDEMPOTENCY_KEY_HOURS"


@pytest.mark.parametrize(("raw", "hours"), [("", 24.0), (" ", 24.0), ("1", 1.0), ("36.5", 36.5)])
def test_a_lifetime_in_hours_defaults_to_a_day(raw: str, hours: float) -> None:
    assert Settings.from_env({NAME: raw}).idempotency_key_hours == hours


@pytest.mark.parametrize("raw", ["0", "0.5", "-3", "abc", "24h", "nan", "inf", "87601"])
def test_a_bad_lifetime_is_refused_at_start_saying_what_is_allowed(raw: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({NAME: raw})
    assert str(raised.value) == (
        f"{NAME} must be a number of hours from 1 to 87600 (default 24); got {raw!r}"
    )
