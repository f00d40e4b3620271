"""A key scoped to workflows acts only on theirs (docs/reference/security.md), and starting
an execution of a workflow is acting on it: a `workflow` step starts its child with the
input its publisher renders, past the child's webhook signature. So a scoped key may
publish a workflow step only to a workflow it may write; the child's own webhooks stay
its senders' (real bin/api and bin/worker)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import requests

from flowforge.store import apikeys
from tests.support.api import Api
from tests.support.processes import Process


def callee() -> dict[str, Any]:
    return {
        "name": "payouts",
        "trigger": {"webhook": {"auth": "signature"}},
        "steps": [{"id": "pay", "type": "transform", "output": "{{ input }}"}],
    }


def caller(target: str) -> dict[str, Any]:
    return {
        "name": "caller",
        "trigger": {"webhook": {"auth": "none"}},
        "steps": [{"id": "call", "type": "workflow", "workflow": target, "input": "{{ input }}"}],
    }


def test_a_scoped_key_cannot_publish_a_call_to_a_workflow_it_may_not_write(
    api: str, api_key: str, db: psycopg.Connection, workers: Callable[..., Process]
) -> None:
    Api(api, api_key).publish("payouts", callee())
    scoped = Api(api, apikeys.create(db, "team-a", workflows=["caller"])[1])
    url = f"{api}/api/v1/workflows/caller/versions"
    r = scoped.session.post(url, json=caller("payouts"), timeout=10)
    assert r.status_code == 403, r.text
    assert "payouts" in r.json()["detail"]
    assert scoped.session.get(f"{api}/api/v1/workflows/caller", timeout=10).status_code == 404

    # Had it published, an anonymous webhook to it would have started the signed workflow.
    workers()
    both = Api(api, apikeys.create(db, "team-ab", workflows=["caller", "payouts"])[1])
    assert both.session.post(url, json=caller("payouts"), timeout=10).status_code == 201
    sent = requests.post(f"{api}/hooks/caller", json={"to": "me"}, timeout=10)
    assert sent.status_code == 202, sent.text
    done = both.wait(sent.json()["execution_id"], "succeeded")
    assert done["status"] == "succeeded"
