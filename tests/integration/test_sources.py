"""Sources (docs/contract.md#sources routing) through real bin/api processes and a bin/worker: one
/hooks/<source> endpoint starts one execution per matching subscription in one
transaction, a redelivery returns the same executions (also when sent to two API
processes at once), an event that matches nothing is answered and recorded, and a
source's name and a workflow key never share /hooks/."""

from __future__ import annotations

import json
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import requests

from tests.support import definitions
from tests.support.api import Api
from tests.support.definitions import github_event, github_source, subscription, transform
from tests.support.processes import start_api
from tests.support.webhooks import github_header

SECRET = "routing-secret-for-github-1234"
WORKFLOWS = ("on-push", "on-main", "on-pr-opened", "on-any", "on-big")


def workflow(name: str) -> dict[str, Any]:
    return definitions.workflow(transform("keep", {"ref": "{{ input.ref }}"}), name=name)


SOURCE = github_source(
    subscription("on-push", github_event("push")),
    subscription(
        "on-main",
        github_event("push"),
        {"path": "input.ref", "op": "eq", "value": "refs/heads/main"},
    ),
    subscription(
        "on-pr-opened",
        github_event("pull_request"),
        {"path": "input.action", "op": "in", "value": ["opened", "reopened"]},
    ),
    {"name": "everything", "workflow": "on-any"},
    {"workflow": "on-big", "filter": {"any": [
        {"path": "input.size", "op": "gte", "value": 100},
        {"path": "input.forced", "op": "eq", "value": True}]}},
)  # fmt: skip


def setup(client: Api) -> None:
    for name in WORKFLOWS:
        client.publish(name, workflow(name))
    r = client.post("/api/v1/sources/gh", SOURCE)
    assert r.status_code == 200, r.text
    assert client.post("/api/v1/sources/gh/webhook-secrets", {"value": SECRET}).status_code == 201


def deliver(
    base: str, event: str, body: dict[str, Any], delivery: str | None = None, secret: str = SECRET
) -> requests.Response:
    raw = json.dumps(body).encode()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": github_header(secret, raw),
    }
    return requests.post(f"{base}/hooks/gh", data=raw, headers=headers, timeout=30)


def counts(db: psycopg.Connection) -> dict[str, int]:
    return {
        table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        for table in ("executions", "steps", "outbox", "idempotency_keys", "source_unmatched")
    }


def test_an_event_starts_every_matching_subscription_once(
    api: str, api_key: str, db: psycopg.Connection, workers: Any
) -> None:
    client = Api(api, api_key)
    setup(client)
    workers()
    delivery = str(uuid.uuid4())
    push = {"ref": "refs/heads/main", "size": 3}
    r = deliver(api, "push", push, delivery)
    assert r.status_code == 202, r.text
    executions = r.json()["executions"]
    assert [(e["subscription"], e["workflow"]) for e in executions] == [
        ("on-push", "on-push"),
        ("on-main", "on-main"),
        ("everything", "on-any"),
    ]
    for e in executions:
        done = client.wait(e["execution_id"])
        assert done["status"] == "succeeded", done
    before = counts(db)

    # A redelivery (GitHub's "Redeliver" keeps the delivery id) is the same executions.
    again = deliver(api, "push", push, delivery)
    assert again.status_code == 202
    assert again.headers["Idempotent-Replayed"] == "true"
    assert [e["execution_id"] for e in again.json()["executions"]] == [
        e["execution_id"] for e in executions
    ]
    # Tampered or signed with another secret: 401, nothing written.
    assert deliver(api, "push", push, secret="another-secret-of-thirty-chars").status_code == 401
    assert counts(db) == before

    # Header and body filters, all and any.
    pr = deliver(api, "pull_request", {"action": "opened", "forced": True}).json()["executions"]
    assert [e["subscription"] for e in pr] == ["on-pr-opened", "everything", "on-big"]
    closed = deliver(api, "pull_request", {"action": "closed"}).json()["executions"]
    assert [e["subscription"] for e in closed] == ["everything"]

    # Matching nothing: 202 with no execution, recorded once per delivery id.
    r = client.post("/api/v1/sources/gh", {**SOURCE, "subscriptions": SOURCE["subscriptions"][:3]})
    assert r.status_code == 200 and r.json()["revision"] == 3  # source, secret, this
    quiet = str(uuid.uuid4())
    for _ in range(2):
        r = deliver(api, "issues", {"action": "labeled"}, quiet)
        assert r.status_code == 202, r.text
        assert r.json()["executions"] == []
    row = db.execute("SELECT identity, input FROM source_unmatched").fetchall()
    assert row == [(quiet, {"action": "labeled"})]

    text = requests.get(f"{api}/metrics", timeout=10).text
    assert _metric(text, 'flowforge_source_events_total{outcome="matched",source="gh"}') >= 4
    assert _metric(text, 'flowforge_source_events_total{outcome="unmatched",source="gh"}') >= 1
    assert (
        _metric(text, 'flowforge_source_matches_total{source="gh",subscription="everything"}') >= 3
    )


def _metric(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert match, f"{series} not exported"
    return float(match[1])


def test_all_matches_in_one_transaction_and_names_never_shared(
    api: str, api_key: str, db: psycopg.Connection
) -> None:
    client = Api(api, api_key)
    setup(client)
    # on-any now requires a field a push lacks: the whole event is refused, and none of
    # the other matching subscriptions started anything.
    checked = {**workflow("on-any"), "input_schema": {"required": ["pusher"]}}
    client.publish("on-any", checked)
    before = counts(db)
    r = deliver(api, "push", {"ref": "refs/heads/main"})
    assert r.status_code == 422, r.text
    assert counts(db) == before

    # One namespace on /hooks/: each side refuses the other's names.
    assert client.post("/api/v1/sources/on-push", SOURCE).status_code == 409
    r = client.session.post(f"{api}/api/v1/workflows/gh/versions", json=workflow("gh"), timeout=10)
    assert r.status_code == 409, r.text
    bad = {
        "subscriptions": [
            {"workflow": "nope"},
            {
                "name": "b",
                "workflow": "on-push",
                "filter": {"all": [{"path": "body.x", "op": "eq", "value": 1}]},
            },
            {"name": "c", "workflow": "on-push", "filter": {"one": []}},
        ]
    }
    r = client.post("/api/v1/sources/other", bad)
    assert r.status_code == 422, r.text
    paths = {e["path"] for e in r.json()["errors"]}
    assert {"$.subscriptions[1].filter.all[0].path", "$.subscriptions[2].filter"} <= paths
    r = client.post("/api/v1/sources/other", {"subscriptions": [{"workflow": "nope"}]})
    assert r.status_code == 422
    assert r.json()["errors"][0]["path"] == "$.subscriptions[0].workflow"


def test_two_api_processes_one_killed_no_event_half_routed(
    env: dict[str, str], tmp_path: Path, api_key: str, db: psycopg.Connection, workers: Any
) -> None:
    """One delivery sent to two API processes at once starts each match once; then API
    `a` is SIGKILLed while deliveries stream in (and a worker too): every event has all
    four of its executions or none, every 202 has all four, and all of them run."""
    first, base_a = start_api(env, tmp_path / "a.log")
    second, base_b = start_api(env, tmp_path / "b.log")
    try:
        setup(Api(base_a, api_key))
        delivery = str(uuid.uuid4())
        body = {"ref": "refs/heads/main", "size": 500}
        with ThreadPoolExecutor(8) as pool:
            answers = list(
                pool.map(
                    lambda i: deliver((base_a, base_b)[i % 2], "push", body, delivery), range(16)
                )
            )
        ids = set()
        for r in answers:
            assert r.status_code in (202, 409), r.text  # 409: a concurrent twin, retry
            if r.status_code == 202:
                ids.add(tuple(e["execution_id"] for e in r.json()["executions"]))
        assert len(ids) == 1
        (started,) = ids
        assert len(started) == 4  # on-push, on-main, everything, on-big
        assert db.execute("SELECT count(*) FROM executions").fetchone()[0] == 4

        doomed = workers()
        answered: list[str] = []

        def send(i: int) -> None:
            delivery = f"d-{i}"
            try:
                r = deliver((base_a, base_b)[i % 2], "push", body, delivery)
            except requests.RequestException:
                return  # the killed process: no answer, nothing promised
            if r.status_code == 202:
                answered.append(delivery)

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(send, i) for i in range(80)]
            time.sleep(0.5)
            first.kill()
            doomed.kill()
            for future in futures:
                future.result()
        per_event = dict(
            db.execute(
                "SELECT key, count(*) FROM idempotency_keys WHERE key LIKE 'source:gh:d-%%' "
                "GROUP BY key"
            ).fetchall()
        )
        print(f"answered {len(answered)} of 80, {len(per_event)} events routed")
        assert set(per_event.values()) == {4}, per_event  # never half an event
        assert {f"source:gh:{d}" for d in answered} <= per_event.keys()
        assert len(answered) >= 40  # every event sent to `b` was answered
        workers()
        client = Api(base_b, api_key)
        ids = [r[0] for r in db.execute("SELECT id FROM executions").fetchall()]
        for execution_id in ids:
            assert client.wait(str(execution_id), timeout=120)["status"] == "succeeded"
    finally:
        first.stop()
        second.stop()
