"""A management request takes one pooled connection, however many checks it makes.

Authentication, the scope check by the execution's workflow and the work itself used to
check out a connection each (four for a scoped key reading an execution); with one
connection per request they share it; it goes back to the pool at teardown.
"""

from __future__ import annotations

from typing import Any

import psycopg

from flowforge.store import apikeys
from tests.support.definitions import OPEN


def checkouts(client: Any, method: str, path: str, key: str, **kwargs: Any) -> int:
    """Connections requested from the app's pool while serving one request."""
    pool = client.application.extensions["flowforge.pool"]
    pool.pop_stats()
    response = client.open(
        path, method=method, headers={"Authorization": f"Bearer {key}"}, **kwargs
    )
    assert response.status_code < 300, response.get_data(as_text=True)
    return int(pool.get_stats().get("requests_num", 0))


def test_a_scoped_management_request_checks_out_one_connection(
    app_client: Any, db: psycopg.Connection, api_key: str
) -> None:
    scoped = apikeys.create(db, "scoped", workflows=["open"])[1]
    assert checkouts(app_client, "POST", "/api/v1/workflows/open/versions", scoped, json=OPEN) == 1
    accepted = app_client.post("/hooks/open", json={"x": 1}).get_json()
    path = f"/api/v1/executions/{accepted['execution_id']}"
    assert checkouts(app_client, "GET", path, scoped) == 1
    assert checkouts(app_client, "POST", f"{path}/cancel", scoped) == 1
    assert checkouts(app_client, "GET", "/api/v1/workflows/open", api_key) == 1
