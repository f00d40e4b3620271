"""The console shows a map step (docs/contract.md#map) as one node with its items: counts by status
and the first page, in-process against a real database."""

from __future__ import annotations

from typing import Any

from flowforge.worker.broker import Wakeup
from tests.integration.test_console import _sign_in
from tests.support import inprocess
from tests.support.definitions import unsigned


def test_a_map_is_one_node_with_its_items_counted_and_a_page_of_them(
    app_client: Any, api_key: str, database_url: str
) -> None:
    definition = unsigned(
        [
            {
                "id": "lines",
                "type": "map",
                "items": "{{ input.lines }}",
                "on_item_failure": "collect",
                "steps": [{"id": "sku", "type": "transform", "output": "{{ item.sku }}"}],
            }
        ]
    )
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    assert app_client.post("/api/v1/workflows/lines/versions", json=definition).status_code == 201
    lines = [{"sku": f"s{n}"} for n in range(30)]
    lines[4] = {"other": 1}  # its template cannot render: the item fails
    eid = app_client.post("/hooks/lines", json={"lines": lines}).get_json()["execution_id"]
    with inprocess.executor(database_url, "test-console-map") as executor:
        executor.handle(Wakeup(eid, "lines"))
    detail = app_client.get(f"/api/v1/executions/{eid}").get_json()
    assert detail["status"] == "failed"
    assert [s["id"] for s in detail["steps"]] == ["lines"]
    app_client.environ_base.pop("HTTP_AUTHORIZATION")

    _sign_in(app_client, api_key)
    page = app_client.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert "30 items:" in page
    assert '<span class="badge status-succeeded">29 succeeded</span>' in page
    assert '<span class="badge status-failed">1 failed</span>' in page
    assert 'id="item-lines-4"' in page and "&#39;sku&#39; not found in item" in page
    assert 'id="item-lines-19"' in page and 'id="item-lines-20"' not in page
    assert "pages the rest" in page
