"""The whole suite's two halves (tests/shards.py, run at once by bin/test) hold every test
module exactly once, so splitting the run never drops a test."""

from __future__ import annotations

import pytest

from tests import shards


def test_every_test_module_is_in_exactly_one_half() -> None:
    everything = sorted(shards.TESTS.rglob("test_*.py"))
    first, second = shards.half(0), shards.half(1)
    assert not set(first) & set(second)
    assert sorted(first + second) == everything


def test_the_integration_modules_named_for_the_first_half_exist() -> None:
    names = {path.name for path in (shards.TESTS / "integration").glob("test_*.py")}
    assert set(shards.FIRST_INTEGRATION) <= names


def test_the_command_prints_a_half_and_refuses_anything_else(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert shards.main(["1"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(p.relative_to(shards.TESTS.parent)) for p in shards.half(1)]
    assert shards.main(["2"]) == 2
