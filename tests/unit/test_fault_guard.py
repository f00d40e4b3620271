"""FLOWFORGE_FAULTS kills production code on purpose, so it works only in test mode."""

from __future__ import annotations

import pytest

from flowforge import faults
from flowforge.store.config import ConfigError, Settings


def test_faults_without_test_mode_refuse_to_start() -> None:
    with pytest.raises(ConfigError, match="FLOWFORGE_TEST_MODE"):
        Settings.from_env({"FLOWFORGE_FAULTS": "before_ack=kill"})


def test_faults_without_test_mode_arm_nothing() -> None:
    """Even code that skips Settings (a fault point is reached at import) stays unarmed."""
    assert faults.armed({"FLOWFORGE_FAULTS": "before_ack=kill"}) == {}
    assert faults.armed({"FLOWFORGE_FAULTS": "before_ack=kill", "FLOWFORGE_TEST_MODE": "0"}) == {}


def test_test_mode_arms_them() -> None:
    env = {"FLOWFORGE_FAULTS": "before_ack=kill, x=sleep:1", "FLOWFORGE_TEST_MODE": "1"}
    assert Settings.from_env(env).test_mode
    assert faults.armed(env) == {"before_ack": "kill", "x": "sleep:1"}


def test_no_faults_needs_no_test_mode() -> None:
    assert not Settings.from_env({}).test_mode
