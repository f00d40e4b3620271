"""Outbound limits belong to their owner (docs/reference/security.md, "Who owns a limit"),
through real bin/api and bin/worker processes and a target on 127.0.0.1: a sender of one
workflow cannot move another workflow's limit nor reach the operator's `host:` limits by
the name it renders; rates and holds have bounds (publish refuses what is out of them, a
Retry-After of centuries holds for the cap); a dated Retry-After is read against the
response's own Date; an operator sees and clears a hold; a scoped key sees and clears only
its own workflows' limits."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from email.utils import formatdate
from typing import Any

import psycopg

from flowforge.domain.definitions import MAX_HOLD_S
from flowforge.store import apikeys
from tests.integration.test_cli_remote import ok, remote
from tests.support.api import Api
from tests.support.definitions import unsigned
from tests.support.processes import Process, wait_for
from tests.support.target import Received, Reply, Target, first_then_ok

HELD_FOR = """
SELECT extract(epoch FROM held_until - now()) FROM outbound_limits
WHERE key = %(key)s AND held_until IS NOT NULL
"""


def limited(url: str, limits: dict[str, Any], limit: str, name: str = "t") -> dict[str, Any]:
    step = {"id": "call", "type": "http_request", "limit": limit, "request": {"url": url}}
    step["retry"] = {"max_attempts": 1}
    return {**unsigned([step], name), "limits": limits}


def _succeeds(client: Api, eid: str, timeout: float) -> None:
    assert client.wait(eid, timeout=timeout)["status"] == "succeeded"


def test_a_sender_of_one_workflow_cannot_move_another_workflows_limit(
    api: str, api_key: str, workers: Callable[..., Process], target: Target
) -> None:
    target.script = lambda _r: Reply(json={"ok": True})
    workers()
    client = Api(api, api_key)
    client.publish("victim", limited(f"{target.url}/v", {"pay": {"rate_per_s": 1}}, "pay"))
    # The attacker's own workflow, behind an anonymous webhook: the tenant is the sender's.
    tenants = {"{{input.tenant}}": {"rate_per_s": 0.001}}
    client.publish("mover", limited(f"{target.url}/t", tenants, "{{input.tenant}}"))
    for _ in range(5):
        client.start("mover", {"tenant": "pay"})
    wait_for(lambda: target.requests_to("/t"), message="the attacker's first request")
    # Each of the attacker's executions took a place 1,000 s later in the schedule of the
    # name "pay" — its own, so the victim's next requests go at its own rate of 1/s.
    for _ in range(3):
        _succeeds(client, client.start("victim", {}), timeout=20)


def test_a_rendered_host_name_stays_in_its_workflow(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    def script(request: Received) -> Reply:
        if request.path.startswith("/t"):
            return Reply(status=429, headers={"Retry-After": "600"})
        return Reply(json={"ok": True})

    target.script = script
    # The operator's limit of host 127.0.0.1; the attacker's own requests go to the same
    # target as "localhost", which the operator did not limit.
    workers(FLOWFORGE_OUTBOUND_LIMITS=json.dumps({"127.0.0.1": {"concurrency": 50}}))
    client = Api(api, api_key)
    client.publish("victim", limited(f"{target.url}/v", {"own": {"concurrency": 5}}, "own"))
    tenants = {"{{input.tenant}}": {"concurrency": 5}}
    mover_url = target.url.replace("127.0.0.1", "localhost") + "/t"
    client.publish("mover", limited(mover_url, tenants, "{{input.tenant}}"))
    client.wait(client.start("mover", {"tenant": "host:127.0.0.1"}), timeout=30)
    # The 429 held the attacker's own limit named "host:127.0.0.1", not the operator's:
    # the victim's request through the operator's limit goes at once.
    _succeeds(client, client.start("victim", {}), timeout=20)
    mover = db.execute("SELECT id::text FROM workflows WHERE key = 'mover'").fetchone()[0]
    rows = db.execute("SELECT owner, key FROM outbound_limits WHERE held_until > now()")
    assert rows.fetchall() == [(mover, "host:127.0.0.1")]
    operators = db.execute("SELECT key FROM outbound_limits WHERE owner = 'host'").fetchall()
    assert operators == [("127.0.0.1",)]


def test_rates_bursts_and_holds_out_of_bounds_are_refused_at_publish(
    api: str, api_key: str, target: Target
) -> None:
    client = Api(api, api_key)
    cases = {
        "rate_per_s": {"rate_per_s": 1e-9},
        "burst": {"rate_per_s": 1, "burst": 0},
        "max_hold_s": {"concurrency": 1, "max_hold_s": MAX_HOLD_S + 1},
    }
    for field, spec in cases.items():
        r = client.session.post(
            f"{api}/api/v1/workflows/tiny/versions",
            json=limited(f"{target.url}/x", {"x": spec}, "x"),
            timeout=10,
        )
        assert r.status_code == 422, (field, r.text)
        assert r.headers["Content-Type"].startswith("application/problem+json")
        paths = [e["path"] for e in r.json()["errors"]]
        assert f"$.limits.x.{field}" in paths, (field, r.text)
    fine = limited(f"{target.url}/x", {"x": {"rate_per_s": 1 / 3600, "max_hold_s": 0}}, "x")
    client.publish("tiny", fine)


def test_a_retry_after_of_centuries_holds_for_the_cap_and_an_operator_clears_it(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    target.script = first_then_ok(Reply(status=429, headers={"Retry-After": "9999999999"}))
    workers()
    client = Api(api, api_key)
    client.publish("quota", limited(f"{target.url}/q", {"quota": {"concurrency": 5}}, "quota"))
    client.wait(client.start("quota", {}), timeout=30)
    (held_s,) = db.execute(HELD_FOR, {"key": "quota"}).fetchone()
    assert MAX_HOLD_S - 30 < held_s <= MAX_HOLD_S, held_s
    waiting = client.start("quota", {})
    wait_for(lambda: client.execution(waiting)["waiting_on_limits"], message="a held step")
    listed = client.session.get(f"{api}/api/v1/circuits", timeout=10).json()["circuits"]
    [hold] = listed
    assert (hold["workflow"], hold["key"], hold["state"]) == ("quota", "quota", "closed")
    assert hold["held_until"] and "Retry-After" in hold["held_reason"]
    # The operator's CLI sees it and ends it (the same call as POST
    # /api/v1/circuits/quota/close?workflow=quota).
    shown = json.loads(ok(remote(api, api_key, "circuits", "list", "--output", "json")))
    assert [c["held_until"] for c in shown["circuits"]] == [hold["held_until"]]
    ok(remote(api, api_key, "circuits", "close", "quota", "--workflow", "quota"))
    _succeeds(client, waiting, timeout=20)
    assert client.session.get(f"{api}/api/v1/circuits", timeout=10).json()["circuits"] == []
    again = client.post("/api/v1/circuits/quota/close?workflow=quota")
    assert again.status_code == 404
    nul = client.post("/api/v1/circuits/%00/close")  # unstorable text: 400 on every route
    assert nul.status_code == 400, nul.text


def test_a_dated_retry_after_is_read_against_the_responses_own_date(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    # A target whose clock is an hour behind ours: its Retry-After is 20 s after its Date.
    # Read against the worker's clock it would be an hour in the past, and hold nothing.
    behind = time.time() - 3600

    def script(request: Received) -> Reply:
        headers = {
            "Date": formatdate(behind, usegmt=True),
            "Retry-After": formatdate(behind + 20, usegmt=True),
        }
        return Reply(status=503, headers=headers)

    target.script = script
    workers()
    client = Api(api, api_key)
    client.publish("dated", limited(f"{target.url}/d", {"dated": {"concurrency": 5}}, "dated"))
    client.wait(client.start("dated", {}), timeout=30)
    row = db.execute(HELD_FOR, {"key": "dated"}).fetchone()
    assert row is not None, "the dated Retry-After held nothing"
    assert 10 < row[0] <= 20, row


def test_a_scoped_key_sees_and_clears_only_its_workflows_limits(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    target.script = lambda _r: Reply(status=429, headers={"Retry-After": "600"})
    # An operator's limit of the host that workflow "theirs" calls (as "localhost").
    workers(FLOWFORGE_OUTBOUND_LIMITS=json.dumps({"localhost": {"concurrency": 50}}))
    client = Api(api, api_key)
    urls = {"mine": target.url, "theirs": target.url.replace("127.0.0.1", "localhost")}
    for name, url in urls.items():
        client.publish(name, limited(f"{url}/{name}", {"q": {"concurrency": 5}}, "q"))
        client.wait(client.start(name, {}), timeout=30)
    everything = client.session.get(f"{api}/api/v1/circuits", timeout=10).json()["circuits"]
    assert sorted((c["workflow"] or "", c["key"]) for c in everything) == [
        ("", "host:localhost"),
        ("mine", "q"),
        ("theirs", "q"),
    ]
    scoped = Api(api, apikeys.create(db, "mine-only", workflows=["mine"])[1])
    seen = scoped.session.get(f"{api}/api/v1/circuits", timeout=10).json()["circuits"]
    assert [(c["workflow"], c["key"]) for c in seen] == [("mine", "q")]
    assert scoped.post("/api/v1/circuits/q/close?workflow=theirs").status_code == 403
    assert scoped.post("/api/v1/circuits/host:localhost/close").status_code == 403
    assert scoped.post("/api/v1/circuits/q/close?workflow=mine").status_code == 200
    left = client.session.get(f"{api}/api/v1/circuits", timeout=10).json()["circuits"]
    assert sorted((c["workflow"] or "", c["key"]) for c in left) == [
        ("", "host:localhost"),
        ("theirs", "q"),
    ]


def test_a_shared_limit_is_the_operators_and_only_the_workflows_it_names_join_it(
    api: str, api_key: str, workers: Callable[..., Process], target: Target
) -> None:
    target.script = lambda _r: Reply(json={"ok": True})
    shared = {"acct": {"rate_per_s": 5, "workflows": ["billing"]}}
    workers(FLOWFORGE_SHARED_LIMITS=json.dumps(shared))
    client = Api(api, api_key)
    for name in ("billing", "intruder"):
        client.publish(name, limited(f"{target.url}/{name}", {"a": {"shared": "acct"}}, "a"))
    _succeeds(client, client.start("billing", {}), timeout=20)
    refused = client.wait(client.start("intruder", {}), timeout=20)
    assert refused["status"] == "failed", refused
    assert not target.requests_to("/intruder")


def test_a_dated_retry_after_without_a_usable_date_is_read_by_the_database_clock(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    # No Date the worker can read: the checkpoint reads the instant against now().
    (db_now,) = db.execute("SELECT extract(epoch FROM now())::float8").fetchone()
    until = formatdate(db_now + 40, usegmt=True)
    headers = {"Date": "not a date", "Retry-After": until}
    target.script = lambda _r: Reply(status=429, headers=headers)
    workers()
    client = Api(api, api_key)
    client.publish("undated", limited(f"{target.url}/u", {"u": {"concurrency": 5}}, "u"))
    client.wait(client.start("undated", {}), timeout=30)
    (held_s,) = db.execute(HELD_FOR, {"key": "u"}).fetchone()
    assert 20 < held_s <= 40, held_s


def test_a_rendered_limit_name_is_bounded(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    target.script = lambda _r: Reply(json={"ok": True})
    workers()
    client = Api(api, api_key)
    tenants = {"{{input.tenant}}": {"concurrency": 2}}
    client.publish("tenants", limited(f"{target.url}/t", tenants, "{{input.tenant}}"))
    failed = client.wait(client.start("tenants", {"tenant": "x" * 201}), timeout=20)
    assert failed["status"] == "failed", failed
    assert not target.requests_to("/t")
    assert db.execute("SELECT count(*) FROM outbound_limits").fetchone()[0] == 0
    _succeeds(client, client.start("tenants", {"tenant": "x" * 200}), timeout=20)
