"""The console's open circuits (docs/contract.md#circuits): a circuit opened by a real bin/worker's
failed requests is listed with its state, closed by hand behind the session's CSRF token (its
waiting step then goes and succeeds); a read-only key sees no close button and is refused;
a key scoped to another workflow sees nothing of it (docs/reference/security.md, "Who owns
a limit")."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import psycopg

from flowforge.store import apikeys
from tests.integration.test_console import _sign_in
from tests.integration.test_outbound_limits import limited
from tests.support.processes import Process
from tests.support.target import Reply, Target

CIRCUIT = {"failures": 1, "window_s": 60, "cool_down_s": 600}


def _until(db: psycopg.Connection, sql: str, expected: Any, message: str) -> None:
    deadline = time.monotonic() + 60
    while db.execute(sql).fetchone()[0] != expected:
        assert time.monotonic() < deadline, message
        time.sleep(0.2)


def test_an_open_circuit_is_listed_and_closed_by_hand(
    open_client: Any,
    db: psycopg.Connection,
    workers: Callable[..., Process],
    target: Target,
) -> None:
    target.script = lambda _r: Reply(status=500)
    definition = limited(f"{target.url}/down", {"down": {"circuit": CIRCUIT}}, "down")
    definition["steps"][0]["retry"] = {"max_attempts": 1}
    r = open_client.post("/api/v1/workflows/down/versions", json=definition)
    assert r.status_code == 201, r.get_data(as_text=True)
    workers()
    assert open_client.post("/hooks/down", json={}).status_code == 202
    _until(
        db,
        "SELECT count(*) FROM outbound_limits WHERE circuit = 'open'",
        1,
        "the circuit to open",
    )
    target.script = lambda _r: Reply(json={"ok": True})
    assert open_client.post("/hooks/down", json={}).status_code == 202
    _until(db, "SELECT count(*) FROM limit_waits", 1, "the second step to wait")
    key = open_client.environ_base.pop("HTTP_AUTHORIZATION").removeprefix("Bearer ")

    # A key scoped to another workflow sees no limit of "down" and cannot close it.
    _, other = apikeys.create(db, "other", workflows=["open"])
    csrf = _sign_in(open_client, other)
    page = open_client.get("/ui/circuits").get_data(as_text=True)
    assert 'id="no-open-circuits"' in page and '<td class="mono">down</td>' not in page
    refused = open_client.post(
        "/ui/circuits/close", data={"csrf": csrf, "key": "down", "workflow": "down"}
    )
    assert refused.status_code == 403
    operators = open_client.post("/ui/circuits/close", data={"csrf": csrf, "key": "host:x"})
    assert operators.status_code == 403
    open_client.post("/ui/signout", data={"csrf": csrf})

    _, viewer = apikeys.create(db, "viewer", read_only=True)
    csrf = _sign_in(open_client, viewer)
    page = open_client.get("/ui/circuits").get_data(as_text=True)
    assert '<td class="mono">down</td>' in page and "circuit-open" in page
    assert "close-circuit" not in page
    refused = open_client.post(
        "/ui/circuits/close", data={"csrf": csrf, "key": "down", "workflow": "down"}
    )
    assert refused.status_code == 403
    open_client.post("/ui/signout", data={"csrf": csrf})

    csrf = _sign_in(open_client, key)
    page = open_client.get("/ui/circuits").get_data(as_text=True)
    assert 'class="close-circuit"' in page
    forged = open_client.post(
        "/ui/circuits/close", data={"csrf": "forged", "key": "down", "workflow": "down"}
    )
    assert forged.status_code == 403
    closed = open_client.post(
        "/ui/circuits/close", data={"csrf": csrf, "key": "down", "workflow": "down"}
    )
    assert closed.status_code == 303
    after = open_client.get(closed.headers["Location"]).get_data(as_text=True)
    assert 'id="circuit-closed"' in after and 'id="no-open-circuits"' in after
    _until(
        db,
        "SELECT count(*) FROM executions WHERE status = 'succeeded'",
        1,
        "the waiting step to go once the circuit was closed by hand",
    )
    again = open_client.post(
        "/ui/circuits/close", data={"csrf": csrf, "key": "down", "workflow": "down"}
    )
    assert again.status_code == 404
    missing = open_client.post("/ui/circuits/close", data={"csrf": csrf, "key": ""})
    assert missing.status_code == 400
    assert re.search(r"Circuits</a>", after)
