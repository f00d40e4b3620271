"""The map step's rules (docs/contract.md#map) in flowforge/domain/engine.py, driven without a
database."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from flowforge.domain.definitions import DefinitionInvalid, parse_definition
from flowforge.domain.model import Outcome
from tests.unit.test_engine import OPERATOR, make_run

OK = Outcome("succeeded", output={"status": 200})
BROKEN = Outcome("failed", error="HTTP 400")


def mapped(
    items: Any = "{{ input.lines }}", steps: list[dict[str, Any]] | None = None, **extra: Any
) -> list[dict[str, Any]]:
    body = steps or [
        {
            "id": "reserve",
            "type": "http_request",
            "request": {
                "method": "POST",
                "url": "http://127.0.0.1:1/r",
                "json": {"sku": "{{ item.sku }}", "n": "{{ index }}"},
                "idempotency_key": "{{ execution.id }}-{{ index }}",
            },
        },
        {
            "id": "result",
            "type": "transform",
            "depends_on": ["reserve"],
            "output": {"sku": "{{ item.sku }}", "at": "{{ index }}"},
        },
    ]
    return [
        {"id": "lines", "type": "map", "items": items, "steps": body, **extra},
        {"id": "after", "type": "transform", "depends_on": ["lines"], "output": "{{ lines }}"},
    ]


def lines(count: int) -> dict[str, Any]:
    return {"lines": [{"sku": f"s{n}"} for n in range(count)]}


def in_flight(run: Any) -> list[str]:
    return sorted(r for r, s in run.steps.items() if "[" in r and s.status in ("ready", "running"))


def test_a_map_runs_at_most_max_parallel_items_and_ends_with_their_results_in_order() -> None:
    run = make_run(mapped(max_parallel=2), lines(5))
    run.advance()
    assert run.steps["lines"].status == "waiting"
    assert in_flight(run) == ["lines[0].reserve", "lines[1].reserve"]
    assert run.dispatch == ["lines[0].reserve", "lines[1].reserve"]
    assert run.context("lines[1].reserve")["item"] == {"sku": "s1"}
    done = 0
    while in_flight(run):
        row = in_flight(run)[-1]
        run.claim(row, "w1")
        assert len(in_flight(run)) <= 2
        run.record_outcome(row, run.steps[row].fencing_token, OK)
        done += 1
    assert done == 5
    assert run.steps["lines"].status == "succeeded"
    assert run.steps["lines"].output == [{"sku": f"s{n}", "at": n} for n in range(5)]
    assert run.steps["after"].output == run.steps["lines"].output
    assert run.status == "succeeded"
    assert set(run.changes.new_steps) == {
        f"lines[{n}].{s}" for n in range(5) for s in ("reserve", "result")
    }


def test_pure_items_all_run_in_one_unit_of_work_and_an_empty_map_succeeds_at_once() -> None:
    body = [
        {"id": "double", "type": "transform", "output": {"n": "{{ item }}", "i": "{{ index }}"}}
    ]
    run = make_run(mapped(items=[1, 2, 3], steps=body, max_parallel=1))
    run.advance()
    assert run.steps["lines"].output == [{"n": 1, "i": 0}, {"n": 2, "i": 1}, {"n": 3, "i": 2}]
    empty = make_run(mapped(items=[], steps=body))
    empty.advance()
    assert empty.steps["lines"].output == [] and empty.status == "succeeded"


@pytest.mark.parametrize(
    ("payload", "error"),
    [({"lines": {"a": 1}}, "not an array"), ({"lines": list(range(10_001))}, "above the cap")],
)
def test_items_that_are_not_an_array_or_too_many_fail_the_map_saying_why(
    payload: Any, error: str
) -> None:
    run = make_run(mapped(), payload)
    run.advance()
    assert run.steps["lines"].status == "failed"
    assert error in (run.steps["lines"].error or "")
    assert run.status == "failed"


def test_fail_fast_fails_the_map_at_the_first_failed_item_and_cancels_the_rest() -> None:
    run = make_run(mapped(max_parallel=3), lines(10))
    run.advance()
    for row in ("lines[0].reserve", "lines[1].reserve"):
        run.claim(row, "w1")
    run.record_outcome("lines[2].reserve", run.steps["lines[2].reserve"].fencing_token, BROKEN)
    assert run.steps["lines"].status == "failed"
    assert "item 2 failed" in (run.steps["lines"].error or "")
    assert run.steps["after"].status == "cancelled"
    # Running items finish and are recorded; a failure of one is not tried again.
    assert run.status == "running"
    run.record_outcome("lines[0].reserve", run.steps["lines[0].reserve"].fencing_token, OK)
    retry = Outcome("retry", error="HTTP 503")
    run.record_outcome("lines[1].reserve", run.steps["lines[1].reserve"].fencing_token, retry)
    assert run.steps["lines[1].reserve"].status == "cancelled"
    assert run.status == "failed"
    assert not any(r.startswith("lines[5]") for r in run.steps)


def test_collect_runs_every_item_then_fails_and_retry_reruns_only_the_failed_ones() -> None:
    run = make_run(mapped(max_parallel=2, on_item_failure="collect"), lines(4))
    run.advance()
    while in_flight(run):
        row = in_flight(run)[0]
        run.claim(row, "w1")
        run.record_outcome(row, run.steps[row].fencing_token, BROKEN if "[1]" in row else OK)
    assert run.steps["lines"].status == "failed"
    assert "1 of 4 items did not succeed (first: item 1" in (run.steps["lines"].error or "")
    assert run.status == "failed"
    run.take_changes()
    run.retry(actor=OPERATOR)
    assert in_flight(run) == ["lines[1].reserve"]
    assert run.steps["lines[0].result"].status == "succeeded"
    run.claim("lines[1].reserve", "w1")
    run.record_outcome("lines[1].reserve", run.steps["lines[1].reserve"].fencing_token, OK)
    assert run.status == "succeeded"
    assert [r["at"] for r in run.steps["lines"].output] == [0, 1, 2, 3]


def test_an_unknown_item_frees_its_place_and_the_map_waits_for_the_verdict() -> None:
    run = make_run(mapped(max_parallel=1), lines(2))
    run.advance()
    run.claim("lines[0].reserve", "w1")
    run.recover_lease("lines[0].reserve")  # POST with an idempotency key: repeat-safe
    assert run.steps["lines[0].reserve"].status == "waiting"
    run = make_run(
        mapped(
            max_parallel=1,
            steps=[
                {
                    "id": "charge",
                    "type": "http_request",
                    "request": {"method": "POST", "url": "http://127.0.0.1:1/c"},
                }
            ],
        ),
        lines(2),
    )
    run.advance()
    run.claim("lines[0].charge", "w1")
    run.recover_lease("lines[0].charge")
    assert run.steps["lines[0].charge"].status == "unknown"
    assert in_flight(run) == ["lines[1].charge"]
    run.claim("lines[1].charge", "w1")
    run.record_outcome("lines[1].charge", run.steps["lines[1].charge"].fencing_token, OK)
    assert run.steps["lines"].status == "waiting"
    assert run.status == "needs_attention"
    run.resolve("lines[0].charge", "succeeded", {"status": 201}, actor=OPERATOR)
    assert run.steps["lines"].output == [{"status": 201}, {"status": 200}]
    assert run.status == "succeeded"


def test_cancel_stops_the_map_and_queued_items_and_lets_running_ones_finish() -> None:
    run = make_run(mapped(max_parallel=2), lines(6))
    run.advance()
    run.claim("lines[0].reserve", "w1")
    run.cancel(actor=OPERATOR)
    assert run.steps["lines"].status == "cancelled"
    assert run.steps["lines[1].reserve"].status == "cancelled"
    assert run.status == "running"
    run.record_outcome("lines[0].reserve", run.steps["lines[0].reserve"].fencing_token, OK)
    assert run.status == "cancelled"
    assert not any(r.startswith("lines[2]") for r in run.steps)


def test_a_map_is_checked_at_publish_with_paths() -> None:
    doc = {
        "name": "t",
        "steps": [
            {
                "id": "m",
                "type": "map",
                "items": list(range(10_001)),
                "max_parallel": 0,
                "on_item_failure": "later",
                "steps": [
                    {"id": "index", "type": "transform", "output": 1},
                    {"id": "w", "type": "wait", "timeout_s": 5},
                    {"id": "x", "type": "transform", "output": "{{ other.y }}"},
                ],
            },
        ],
    }
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition(doc)
    paths = {e["path"]: e["message"] for e in caught.value.errors}
    assert "cap of 10000" in paths["$.steps[0].items"]
    assert "$.steps[0].max_parallel" in paths and "$.steps[0].on_item_failure" in paths
    assert "reserved" in paths["$.steps[0].steps[0].id"]
    assert "wait step cannot" in paths["$.steps[0].steps[1].type"]
    assert "'other'" in paths["$.steps[0].steps[2].output"]
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition({"name": "t", "steps": [{"id": "m", "type": "map"}]})
    assert {e["path"] for e in caught.value.errors} == {"$.steps[0].items", "$.steps[0].steps"}


def test_a_unit_of_work_starts_a_bounded_number_of_items_and_the_map_goes_on_in_the_next() -> None:
    body = [{"id": "double", "type": "transform", "output": "{{ item }}"}]
    run = make_run(mapped(items=list(range(1200)), steps=body, max_parallel=50))
    run.advance()
    assert run.steps["lines"].status == "ready"
    assert run.dispatch == ["lines"]
    assert len(run.changes.new_steps) == 500
    for _ in range(2):
        rows = {row_id: state for row_id, state in run.steps.items()}
        run = make_run(mapped(items=list(range(1200)), steps=body, max_parallel=50))
        run.steps.update(rows)
        run.advance()
    assert run.steps["lines"].status == "succeeded"
    assert run.steps["lines"].output == list(range(1200))


OPEN_ROW = frozenset({"pending", "ready", "running", "waiting"})


class Rows:
    """The step rows as saved, and a unit of work's load of them as the worker's is
    (flowforge/store/runs.py, open_items): the map's open items only."""

    def __init__(self, run: Any) -> None:
        self.template = run
        self.saved = {sid: copy.copy(state) for sid, state in run.steps.items()}
        self.full_loads: list[str] = []
        self.most_loaded = 0

    def load(self) -> Any:
        open_items = {
            sid.split("]")[0]
            for sid, state in self.saved.items()
            if "[" in sid and state.status in OPEN_ROW
        }
        loaded = {
            sid: copy.copy(state)
            for sid, state in self.saved.items()
            if "[" not in sid or sid.split("]")[0] in open_items
        }
        settled = frozenset(
            state.status
            for sid, state in self.saved.items()
            if sid not in loaded and state.status not in ("succeeded", "skipped")
        )
        self.most_loaded = max(self.most_loaded, len(loaded))

        def load_items(map_id: str) -> list[Any]:
            self.full_loads.append(map_id)
            return [copy.copy(s) for sid, s in self.saved.items() if sid.startswith(f"{map_id}[")]

        t = self.template
        return dataclasses.replace(
            t, steps=loaded, status=self.status, unloaded={"lines": settled}, load_items=load_items
        )

    def save(self, run: Any) -> None:
        changes = run.take_changes()
        for sid, state in changes.steps.items():
            self.saved[sid] = copy.copy(state)
        self.status = changes.status

    status = "queued"


def test_a_run_that_loaded_only_the_open_items_goes_on_and_loads_the_rest_once_at_the_end() -> None:
    first = make_run(mapped(max_parallel=2, on_item_failure="collect"), lines(8))
    rows = Rows(first)
    run = rows.load()
    run.advance()
    rows.save(run)
    assert rows.saved["lines"].output == {"items": 8, "started": 2}
    # Starting, the map does not know how many of its items have rows (a retry may have
    # left some): it reads them, once (none, here).
    assert rows.full_loads == ["lines"]
    rows.full_loads.clear()
    while True:
        ready = sorted(s for s, st in rows.saved.items() if "[" in s and st.status == "ready")
        if not ready:
            break
        run = rows.load()
        run.claim(ready[0], "w1")
        rows.save(run)
        run = rows.load()
        outcome = BROKEN if ready[0].startswith("lines[5]") else OK
        run.record_outcome(ready[0], run.steps[ready[0]].fencing_token, outcome)
        rows.save(run)
        # Loads along the way: the map and the step after it, two items of two rows.
        assert rows.full_loads == [] or rows.saved["lines"].status != "waiting"
    assert rows.most_loaded <= 2 + 2 * 2
    assert rows.full_loads == ["lines"]  # once, when every item had ended
    assert rows.saved["lines"].status == "failed"
    assert "1 of 8 items did not succeed (first: item 5" in (rows.saved["lines"].error or "")
    assert rows.status == "failed"

    run = rows.load()
    run.retry(actor=OPERATOR)  # an operator's action loads every item first
    rows.save(run)
    assert [s for s, st in rows.saved.items() if st.status == "ready"] == ["lines[5].reserve"]
    run = rows.load()
    run.claim("lines[5].reserve", "w1")
    rows.save(run)
    run = rows.load()
    run.record_outcome("lines[5].reserve", run.steps["lines[5].reserve"].fencing_token, OK)
    rows.save(run)
    assert rows.status == "succeeded"
    assert [r["at"] for r in rows.saved["lines"].output] == list(range(8))
    assert rows.saved["after"].output == rows.saved["lines"].output


def test_an_unknown_item_that_was_not_loaded_still_makes_the_execution_need_attention() -> None:
    post = {"method": "POST", "url": "http://127.0.0.1:1/c"}
    body = [{"id": "charge", "type": "http_request", "request": post}]
    rows = Rows(make_run(mapped(max_parallel=1, steps=body), lines(3)))
    run = rows.load()
    run.advance()
    rows.save(run)
    run = rows.load()
    run.claim("lines[0].charge", "w1")
    rows.save(run)
    run = rows.load()
    run.recover_lease("lines[0].charge")  # a POST without a key: its effect is unknown
    rows.save(run)
    for row in ("lines[1].charge", "lines[2].charge"):
        run = rows.load()
        assert "lines[0].charge" not in run.steps  # settled: not loaded
        run.claim(row, "w1")
        rows.save(run)
        run = rows.load()
        run.record_outcome(row, run.steps[row].fencing_token, OK)
        rows.save(run)
    assert rows.saved["lines"].status == "waiting"
    assert rows.status == "needs_attention"
    # A later load holds none of the items; what they hold still decides the status.
    run = rows.load()
    assert not any("[" in row for row in run.steps)
    run.derive_status()
    assert run.status == "needs_attention"
    run.resolve("lines[0].charge", "succeeded", {"status": 201}, actor=OPERATOR)
    rows.save(run)
    assert rows.saved["lines"].output == [{"status": 201}, {"status": 200}, {"status": 200}]
    assert rows.status == "succeeded"
