"""The console's version diff: structural, in the author's order, steps matched by id,
and bounded in size and time whatever two definitions hold."""

from __future__ import annotations

import json
import time

from flowforge.domain.defdiff import MAX_CHANGES, MAX_VALUE, diff


def test_changes_are_listed_in_the_authors_order_with_their_paths() -> None:
    old = {
        "name": "Charge",
        "trigger": {"webhook": {"auth": "none"}},
        "steps": [
            {"id": "charge", "type": "http_request", "request": {"timeout_s": 2}},
            {"id": "receipt", "type": "transform", "output": {}},
        ],
    }
    charge, receipt = old["steps"]
    new = {
        **old,
        "trigger": {"webhook": {"auth": "signature"}},
        "steps": [
            {**charge, "request": {"timeout_s": 5}},
            {"id": "notify", "type": "transform", "output": {}},
            receipt,
        ],
        "retention_days": 7,
    }
    assert diff(old, new).lines("v1", "v2") == [
        "--- v1",
        "+++ v2",
        '~ $.trigger.webhook.auth: "none" → "signature"',
        "~ $.steps[id=charge].request.timeout_s: 2 → 5",
        '+ $.steps[id=notify]: {"id": "notify", "type": "transform", "output": {}}',
        "+ $.retention_days: 7",
    ]
    assert diff(new, new).lines("v2", "v2") == []


def test_a_removed_key_stays_where_the_author_had_it_and_a_reorder_is_one_change() -> None:
    old = {"a": 1, "b": 2, "c": 3, "steps": [{"id": "x"}, {"id": "y"}]}
    new = {"a": 1, "c": 3, "steps": [{"id": "y"}, {"id": "x"}]}
    assert [path for _, path, _ in diff(old, new).changes] == ["$.b", "$.steps order"]


def _steps(prefix: str, value: str) -> dict[str, object]:
    return {
        "steps": [
            {"id": f"{prefix}{i}", "type": "transform", "output": {"v": value}} for i in range(1500)
        ]
    }


def test_an_adversarial_pair_of_large_versions_answers_fast_and_small() -> None:
    """~94 KB each: 1,500 near-identical steps that all differ (the pair a line diff is
    slowest on), then 1,500 removed and 1,500 added. The walk is linear in both documents
    and its answer stops at MAX_CHANGES; the time is printed, not asserted."""
    for old, new in (
        (_steps("s", "a" * 8), _steps("s", "b" * 8)),
        (_steps("old", "a" * 6), _steps("new", "a" * 6)),
    ):
        assert 80_000 < len(json.dumps(old)) < 110_000
        started = time.perf_counter()
        found = diff(old, new)
        elapsed = time.perf_counter() - started
        assert found.truncated and len(found.changes) == MAX_CHANGES
        assert sum(len(line) for line in found.lines("v1", "v2")) < 50_000
        print(f"diff of two {len(json.dumps(old))}-byte versions: {elapsed * 1000:.1f} ms")


def test_long_values_are_cut() -> None:
    (change,) = diff({"x": "a" * 10_000}, {"x": "b" * 10_000}).changes
    assert len(change[2]) <= 2 * MAX_VALUE + 3
