"""Resume onto a version (docs/howto/morning-after-an-outage.md), through real bin/api and
bin/worker processes and the `flowforge` command: the executions that arrived while the
workflow was paused, pinned to the broken version, are re-pinned onto the fix when it is
resumed, so they need no second bulk replay; one that had started a step keeps its
version; the refusals (not paused, no such version, a malformed body) change nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from tests.integration.test_api_keys import cli
from tests.integration.test_cli_remote import ok, remote
from tests.support.api import Api, step
from tests.support.processes import Process, wait_for
from tests.support.target import Received, Reply, Target


def version(target: Target, tag: str) -> dict[str, Any]:
    """Two calls; each version calls its own paths, so the target tells them apart."""
    return {
        "name": f"orders {tag}",
        "trigger": {"webhook": {"auth": "none"}},
        "steps": [
            {
                "id": "first",
                "type": "http_request",
                "request": {"method": "POST", "url": f"{target.url}/{tag}/first", "json": {}},
            },
            {
                "id": "second",
                "type": "http_request",
                "depends_on": ["first"],
                "request": {"method": "POST", "url": f"{target.url}/{tag}/second", "json": {}},
            },
        ],
    }


class HoldFirst:
    """Holds the very first request until released; answers every request 200."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.seen = 0

    def __call__(self, received: Received) -> Reply:
        with self.lock:
            self.seen += 1
            first = self.seen == 1
        if first:
            self.arrived.set()
            self.release.wait(30)
        return Reply(json={"ok": True})


def test_resume_onto_latest_repins_what_never_started_and_keeps_what_did(
    api: str,
    api_key: str,
    client: Api,
    target: Target,
    workers: Callable[..., Process],
    db: psycopg.Connection,
    database_url: str,
) -> None:
    held = HoldFirst()
    target.script = held
    client.publish("orders", version(target, "v1"))
    workers()
    started = client.start("orders", {"n": 0})
    assert held.arrived.wait(20), "the first request never arrived"

    # Not paused: nothing to re-pin safely (a worker could start any of them).
    not_paused = client.post("/api/v1/workflows/orders/resume", {"onto": "latest"})
    assert not_paused.status_code == 409, not_paused.text

    assert client.post("/api/v1/workflows/orders/pause").status_code == 200
    arrived = [client.start("orders", {"n": n}) for n in range(1, 4)]
    held.release.set()
    wait_for(
        lambda: step(client.execution(started), "first")["status"] == "succeeded",
        message="the request in flight to be recorded",
    )
    client.publish("orders", version(target, "v2"))

    # Refusals change nothing: the workflow stays paused, every execution on version 1.
    for body, status in (
        ({"onto": 3}, 422),
        ({"onto": "newest"}, 422),
        ({"onto": 0}, 422),
        ({"onto": 2**40}, 422),
        ({"onto": True}, 422),
        ({"onto": 2, "more": 1}, 422),
        ([2], 422),
    ):
        answer = client.post("/api/v1/workflows/orders/resume", body)
        assert answer.status_code == status, (body, answer.text)
    wrong = remote(api, api_key, "workflow", "resume", "orders", "--onto", "3")
    assert wrong.returncode == 2 and wrong.stdout == "", wrong
    assert wrong.stderr.startswith("error: Invalid version: workflow 'orders' has no version 3")
    huge = cli(database_url, "workflow", "resume", "orders", "--onto", str(2**40))
    assert huge.returncode == 2 and "has no version" in huge.stderr, huge
    assert db.execute("SELECT paused_at IS NOT NULL FROM workflows").fetchone() == (True,)
    assert db.execute(
        "SELECT DISTINCT v.version FROM executions e JOIN workflow_versions v "
        "ON v.id = e.version_id"
    ).fetchall() == [(1,)]

    said = ok(remote(api, api_key, "workflow", "resume", "orders", "--onto", "latest"))
    assert said.startswith("3 never-started executions re-pinned onto version 2; ")
    assert "workflow orders is running again" in said

    for eid in [started, *arrived]:
        assert client.wait(eid, timeout=40)["status"] == "succeeded"
    # The one that had started a step finished on its version; the others ran the fix.
    assert client.execution(started)["version"] == 1
    paths = sorted(r.path for r in target.received)
    assert paths == ["/v1/first", "/v1/second"] + ["/v2/first"] * 3 + ["/v2/second"] * 3
    for eid in arrived:
        execution = client.execution(eid)
        assert execution["version"] == 2
        repinned = [e for e in execution["events"] if e["kind"] == "execution.repinned"]
        assert len(repinned) == 1
        detail = repinned[0]["detail"]
        assert (detail["from_version"], detail["version"]) == (1, 2)
        assert detail["actor"]["kind"] == "api_key"
    assert not [e for e in client.execution(started)["events"] if "repinned" in e["kind"]]

    # On the box, the same command; a workflow with nothing to move says 0.
    assert client.post("/api/v1/workflows/orders/pause").status_code == 200
    done = json.loads(
        ok(cli(database_url, "--output", "json", "workflow", "resume", "orders", "--onto", "2"))
    )
    assert (done["onto"], done["repinned"], done["kept"], done["paused"]) == (2, 0, 0, False)


def test_one_whose_concurrency_key_would_change_keeps_its_version_and_none_is_lost(
    client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    """No worker runs until the resume: the executions are queued, never taken up (the
    re-pin writes the wake-ups of their new roots). Under version 2 the concurrency key
    is another input field: the one whose key changes keeps version 1 (its slot belongs
    to its key), the one whose key is the same moves; both then run to the end."""
    target.script = lambda received: Reply(json={"ok": True})
    v1 = {**version(target, "v1"), "concurrency": {"limit": 1, "key": "{{ input.region }}"}}
    v2 = {**version(target, "v2"), "concurrency": {"limit": 1, "key": "{{ input.shop }}"}}
    client.publish("orders", v1)
    assert client.post("/api/v1/workflows/orders/pause").status_code == 200
    same = client.start("orders", {"region": "eu", "shop": "eu"})
    other = client.start("orders", {"region": "eu-2", "shop": "s-9"})
    client.publish("orders", v2)

    resumed = client.post("/api/v1/workflows/orders/resume", {"onto": "latest"})
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["onto"], resumed.json()["repinned"], resumed.json()["kept"]) == (2, 1, 1)
    workers()
    assert client.wait(same, timeout=40)["status"] == "succeeded"
    assert client.wait(other, timeout=40)["status"] == "succeeded"
    assert (client.execution(same)["version"], client.execution(other)["version"]) == (2, 1)
    assert sorted(r.path for r in target.received) == [
        "/v1/first",
        "/v1/second",
        "/v2/first",
        "/v2/second",
    ]
