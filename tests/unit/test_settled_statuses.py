"""The settled statuses tests wait for are defined once, in tests/support/api.

tests/soak/checker.py still spells out its own SETTLED (another developer owns tests/soak/);
this test holds that copy to the one definition until it imports it.
"""

from __future__ import annotations

from flowforge.domain.model import TERMINAL_EXECUTION, ExecutionStatus
from tests.soak import checker
from tests.support.api import TERMINAL


def test_settled_is_every_final_status_and_needs_attention_as_plain_strings() -> None:
    # Plain strings: psycopg would send an enum member by its name (SUCCEEDED).
    assert all(type(status) is str for status in TERMINAL)
    assert {*TERMINAL_EXECUTION, ExecutionStatus.NEEDS_ATTENTION} == TERMINAL


def test_the_soak_checker_settles_on_the_same_statuses() -> None:
    assert set(checker.SETTLED) == TERMINAL
