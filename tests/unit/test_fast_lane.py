"""The fast lane (bin/test --fast, docs/howto/develop.md) keeps its promise: it still starts
a real bin/api and bin/worker, and no fault, soak or bench module slips into it."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from tests.e2e import test_end_to_end

TESTS = Path(__file__).resolve().parents[1]


def test_the_lane_runs_one_webhook_through_a_real_api_and_worker() -> None:
    assert test_end_to_end.pytestmark == pytest.mark.fast
    run = test_end_to_end.test_webhook_runs_a_workflow_to_completion
    assert {"api", "workers"} <= set(inspect.signature(run).parameters)


def test_this_test_is_in_the_lane(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("fast") is not None


@pytest.mark.parametrize("folder", ["faults", "soak", "bench"])
def test_no_heavy_module_joins_the_lane(folder: str) -> None:
    marked = [
        str(path.relative_to(TESTS))
        for path in sorted((TESTS / folder).rglob("*.py"))
        if "mark.fast" in path.read_text()
    ]
    assert marked == []
