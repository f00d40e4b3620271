"""What a map of many items (docs/contract.md#map) costs to read, against a real database and the
worker's own Executor in-process: a unit of work loads the items in flight, not every
item the map ran; the execution page and the console count items by status without
reading every item's rows, and page them.

The cost is counted, not timed: the rows of `steps` a transaction read
(pg_stat_xact_user_tables), with sequential scans off so that the count says which
rows the statements ask for rather than how small the test's table is. Timings are
in the bench (tests/bench/fanout.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from flowforge.store import timeline
from flowforge.store.runs import load_run
from flowforge.worker.broker import Wakeup
from flowforge.worker.executor import Executor
from tests.integration.test_console import _sign_in
from tests.support import inprocess
from tests.support.definitions import unsigned
from tests.support.target import Reply, Target

STEPS_READ = """
SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
FROM pg_stat_xact_user_tables WHERE relname = 'steps'
"""
READY_ITEMS = """
SELECT step_id FROM steps
WHERE execution_id = %(id)s AND status = 'ready' AND strpos(step_id, '[') > 0
ORDER BY step_id
"""


@pytest.fixture
def executor(database_url: str) -> Iterator[Executor]:
    with inprocess.executor(database_url, "test-map-reads", "worker-map-reads") as made:
        yield made


def _publish(app_client: Any, api_key: str, key: str, steps: list[dict[str, Any]]) -> None:
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    answer = app_client.post(f"/api/v1/workflows/{key}/versions", json=unsigned(steps))
    assert answer.status_code == 201, answer.get_data(as_text=True)


def _rows_read(database_url: str, read: Any) -> tuple[Any, int]:
    """What `read(conn)` returns, and how many rows of `steps` it read."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ANALYZE steps")  # as autovacuum would have, for the planner's guesses
    with psycopg.connect(database_url) as conn, conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        before = conn.execute(STEPS_READ).fetchone()
        found = read(conn)
        after = conn.execute(STEPS_READ).fetchone()
    return found, (after[0] if after else 0) - (before[0] if before else 0)


def test_a_unit_of_work_of_a_map_loads_the_items_in_flight_not_every_item_it_ran(
    app_client: Any, api_key: str, database_url: str, executor: Executor, target: Target
) -> None:
    target.script = lambda r: Reply(json={"n": int(r.path.rsplit("/", 1)[1])})
    _publish(
        app_client,
        api_key,
        "calls",
        [
            {
                "id": "lines",
                "type": "map",
                "items": "{{ input.lines }}",
                "max_parallel": 3,
                "steps": [
                    {
                        "id": "call",
                        "type": "http_request",
                        "request": {"method": "GET", "url": f"{target.url}/n/{{{{ index }}}}"},
                    },
                    {
                        "id": "keep",
                        "type": "transform",
                        "depends_on": ["call"],
                        "output": {"n": "{{ call.body.n }}", "at": "{{ index }}"},
                    },
                ],
            },
            {"id": "after", "type": "transform", "depends_on": ["lines"], "output": "{{ lines }}"},
        ],
    )
    eid = app_client.post("/hooks/calls", json={"lines": list(range(60))}).get_json()[
        "execution_id"
    ]
    executor.handle(Wakeup(eid, "lines"))
    done = 0
    while True:
        with psycopg.connect(database_url) as conn:
            ready = [row[0] for row in conn.execute(READY_ITEMS, {"id": eid})]
        if not ready:
            break
        assert len(ready) <= 3
        if done == 40:
            # 40 items ended, 3 in flight: the worker's load reads the map's row, the
            # step after it and the 3 open items' rows, not the 80 rows of the ended ones.
            run, read = _rows_read(
                database_url,
                lambda conn, woken=ready[0]: load_run(conn, eid, open_items=True, also=[woken]),
            )
            assert run is not None
            assert sorted(run.steps) == sorted(
                ["lines", "after"]
                + [
                    f"{row.rsplit('.', 1)[0]}.{local}"
                    for row in ready
                    for local in ("call", "keep")
                ]
            )
            # The open rows are read a few times over (which items are open, then their
            # rows, then what the others hold); the 80 rows of the ended items never.
            assert read <= 2 + 4 * 2 * 3, read
            assert run.steps["lines"].output == {"items": 60, "started": 43}
        executor.handle(Wakeup(eid, ready[0]))
        done += 1
    assert done == 60
    detail = app_client.get(f"/api/v1/executions/{eid}").get_json()
    assert detail["status"] == "succeeded"
    lines = next(s for s in detail["steps"] if s["id"] == "lines")
    assert lines["output"] == [{"n": n, "at": n} for n in range(60)]
    assert lines["items"]["counts"]["succeeded"] == 60
    assert next(s for s in detail["steps"] if s["id"] == "after")["output"] == lines["output"]
    sent = sorted(int(r.path.rsplit("/", 1)[1]) for r in target.requests_to("/n/"))
    assert sent == list(range(60))


def _collected(app_client: Any, api_key: str, executor: Executor, count: int) -> str:
    """An execution whose `collect` map of `count` pure items ran, items 3, 250 and 411
    failed (their template cannot render)."""
    _publish(
        app_client,
        api_key,
        "lines",
        [
            {
                "id": "lines",
                "type": "map",
                "items": "{{ input.lines }}",
                "on_item_failure": "collect",
                "steps": [{"id": "sku", "type": "transform", "output": "{{ item.sku }}"}],
            }
        ],
    )
    lines: list[dict[str, Any]] = [{"sku": f"s{n}"} for n in range(count)]
    for n in (3, 250, 411):
        lines[n] = {"other": n}
    eid = app_client.post("/hooks/lines", json={"lines": lines}).get_json()["execution_id"]
    # Past 500 items a unit of work leaves the map ready for the next one.
    for _ in range(2):
        executor.handle(Wakeup(eid, "lines"))
    return str(eid)


def test_the_execution_page_counts_a_maps_items_by_status_without_reading_every_item(
    app_client: Any, api_key: str, database_url: str, executor: Executor
) -> None:
    eid = _collected(app_client, api_key, executor, 600)
    detail, read = _rows_read(database_url, lambda conn: timeline.execution_detail(conn, eid))
    assert detail["status"] == "failed"
    items = detail["steps"][0]["items"]
    assert items["total"] == 600
    assert {k: v for k, v in items["counts"].items() if v} == {"succeeded": 597, "failed": 3}
    assert [i["index"] for i in items["items"]] == list(range(20))
    assert items["items"][3]["status"] == "failed" and items["items"][4]["status"] == "succeeded"
    # The map's row, the three failed items' rows, the page's 20: not the 600 items.
    assert read <= 1 + 3 + 20, read

    def page(**params: Any) -> dict[str, Any]:
        answer = app_client.get(f"/api/v1/executions/{eid}/steps/lines/items", query_string=params)
        assert answer.status_code == 200, answer.get_data(as_text=True)
        found: dict[str, Any] = answer.get_json()
        return found

    failed = page(status="failed", limit=2)
    assert [i["index"] for i in failed["items"]] == [3, 250] and failed["next_after"] == 250
    assert [i["index"] for i in page(status="failed", after=250)["items"]] == [411]
    ok = page(status="succeeded", after=248, limit=3)
    assert [i["index"] for i in ok["items"]] == [249, 251, 252]
    assert [s["output"] for i in ok["items"] for s in i["steps"]] == ["s249", "s251", "s252"]
    assert page(status="queued")["items"] == []


def test_the_console_pages_a_maps_items_and_filters_them_by_status(
    app_client: Any, api_key: str, executor: Executor
) -> None:
    eid = _collected(app_client, api_key, executor, 600)
    app_client.environ_base.pop("HTTP_AUTHORIZATION")
    _sign_in(app_client, api_key)
    first = app_client.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert 'id="item-lines-19"' in first and 'id="item-lines-20"' not in first
    assert f"/ui/executions/{eid}?items=lines&amp;items_after=19" in first
    assert f"/ui/executions/{eid}?items=lines&amp;items_status=failed" in first
    second = app_client.get(f"/ui/executions/{eid}?items=lines&items_after=19")
    assert second.status_code == 200
    text = second.get_data(as_text=True)
    assert 'id="item-lines-20"' in text and 'id="item-lines-39"' in text
    assert 'id="item-lines-19"' not in text and 'id="item-lines-40"' not in text
    assert "items_after=39" in text
    # The live fragment refreshes the same page.
    assert f"/ui/executions/{eid}/live?items=lines&amp;items_after=19" in text
    failed = app_client.get(f"/ui/executions/{eid}?items=lines&items_status=failed")
    text = failed.get_data(as_text=True)
    rows = [n for n in range(600) if f'id="item-lines-{n}"' in text]
    assert rows == [3, 250, 411]
    assert "showing the failed ones" in text
    for query in ("items=nope", "items=lines&items_after=x", "items=lines&items_status=bad"):
        assert app_client.get(f"/ui/executions/{eid}?{query}").status_code == 400
