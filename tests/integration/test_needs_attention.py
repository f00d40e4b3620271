"""One definition of "needs an operator" (flowforge/store/attention.py): every execution with an
unknown step, whatever its own status, and every one in status needs_attention. The API's
filter, the console's chip and filter, and the gauge the FlowForgeNeedsAttention alert
reads all count the same executions."""

from __future__ import annotations

from typing import Any

import psycopg
import yaml

from flowforge.store.gauges import DatabaseGauges
from tests.integration.test_console import _ids, _sign_in
from tests.unit.test_alert_rules import RULES


def _leave(db: psycopg.Connection, execution_id: str, status: str, unknown: bool) -> None:
    """As a worker and an operator leave them: the execution's status, maybe an unknown step."""
    db.execute("UPDATE executions SET status = %s WHERE id = %s", (status, execution_id))
    if unknown:
        db.execute("UPDATE steps SET status = 'unknown' WHERE execution_id = %s", (execution_id,))


def test_api_console_and_gauge_count_the_same_executions(
    published: Any,
    api_key: str,
    db: psycopg.Connection,
) -> None:
    ids = [r[0] for r in db.execute("SELECT id::text FROM executions ORDER BY id DESC").fetchall()]
    # Newest first: cancelled around an unknown step, needs_attention, succeeded.
    _leave(db, ids[0], "cancelled", unknown=True)
    _leave(db, ids[1], "needs_attention", unknown=True)
    _leave(db, ids[2], "succeeded", unknown=False)
    needing = ids[:2]

    api = published.get(
        "/api/v1/executions?status=needs_attention", headers={"Authorization": f"Bearer {api_key}"}
    ).get_json()
    assert [item["id"] for item in api["items"]] == needing

    _sign_in(published, api_key)
    listing = published.get("/ui/executions?status=needs_attention").get_data(as_text=True)
    assert _ids(listing) == needing
    chip = published.get("/ui/executions").get_data(as_text=True)
    assert "needs_attention <b>2</b>" in chip, chip
    assert "cancelled <b>1</b>" in chip  # the cancelled one keeps its own chip too

    gauges = {m.name: m for m in DatabaseGauges(db).collect()}
    (sample,) = gauges["flowforge_executions_needing_attention"].samples
    assert sample.value == 2

    rules = yaml.safe_load(RULES.read_text())
    (alert,) = [
        r
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == "FlowForgeNeedsAttention"
    ]
    assert "flowforge_executions_needing_attention" in alert["expr"]
