"""An unsigned source (auth none) cannot start a workflow whose own webhooks must be
signed (found in the issue 22 review): otherwise anyone could start the signed workflow
through /hooks/<source>. Refused when the source is saved (422 naming the subscription)
and, when the workflow is published signed later, when an event is routed (401, nothing
created)."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.support.definitions import unsigned

STEPS = [{"id": "a", "type": "transform", "output": {"n": "{{ input.n }}"}}]
SIGNED = {"name": "signed", "steps": STEPS}  # no trigger: signature is the default
SOURCE = {"auth": "none", "subscriptions": [{"workflow": "target"}]}


def test_an_unsigned_source_cannot_start_a_signed_workflow(
    open_client: Any, db: psycopg.Connection
) -> None:
    assert open_client.post("/api/v1/workflows/target/versions", json=SIGNED).status_code == 201
    r = open_client.post("/api/v1/sources/open-door", json=SOURCE)
    assert r.status_code == 422, r.get_data(as_text=True)
    assert r.get_json()["errors"][0]["path"] == "$.subscriptions[0].workflow"
    assert db.execute("SELECT count(*) FROM sources").fetchone() == (0,)

    # Saved while the workflow was unsigned, then the workflow is published signed.
    r = open_client.post("/api/v1/workflows/target/versions", json=unsigned(STEPS))
    assert r.status_code == 201
    assert open_client.post("/api/v1/sources/open-door", json=SOURCE).status_code == 200
    assert open_client.post("/hooks/open-door", json={"n": 1}).status_code == 202
    assert open_client.post("/api/v1/workflows/target/versions", json=SIGNED).status_code == 201
    before = db.execute("SELECT count(*) FROM executions").fetchone()
    r = open_client.post("/hooks/open-door", json={"n": 2})
    assert r.status_code == 401, r.get_data(as_text=True)
    assert "only signed webhooks" in r.get_json()["detail"]
    assert db.execute("SELECT count(*) FROM executions").fetchone() == before
