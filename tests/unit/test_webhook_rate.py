"""FLOWFORGE_WEBHOOK_RATE: a default limit unless turned off (issue 22 item 11); the 429
itself is tested against bin/api in tests/integration/test_intake_floods.py."""

from __future__ import annotations

import pytest

from flowforge.store.config import DEFAULT_WEBHOOK_RATE, ConfigError, Settings


def test_unset_means_the_default_limit() -> None:
    assert Settings.from_env({}).webhook_rate == DEFAULT_WEBHOOK_RATE == 100


@pytest.mark.parametrize("off", ["0", "unlimited", "Unlimited "])
def test_zero_or_unlimited_turns_it_off(off: str) -> None:
    assert Settings.from_env({"FLOWFORGE_WEBHOOK_RATE": off}).webhook_rate == 0


def test_a_rate_is_taken_and_nonsense_refused() -> None:
    assert Settings.from_env({"FLOWFORGE_WEBHOOK_RATE": "2.5"}).webhook_rate == 2.5
    for bad in ("-1", "fast"):
        with pytest.raises(ConfigError):
            Settings.from_env({"FLOWFORGE_WEBHOOK_RATE": bad})
