"""The wait step (docs/contract.md#wait) through real bin/api and bin/worker processes: resume URLs,
early, late and racing resumes, timeouts, cancel, operators, and where tokens never go."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from tests.faults.helpers import cli, is_problem, signed_headers
from tests.support.api import Api, step
from tests.support.definitions import http, wait, workflow
from tests.support.processes import Process, wait_for
from tests.support.target import Received, Reply, Target


@pytest.fixture
def client(api: str, api_key: str, workers: Callable[..., Process]) -> Api:
    workers(FLOWFORGE_PUBLIC_URL=api)
    return Api(api, api_key)


def approval(target: Target, **fields: Any) -> dict[str, Any]:
    """Ask a chat service to approve (sending it the resume URL), wait, then ship."""
    asking = {"order": "{{ input.order }}", "url": "{{ waits.approval.url }}"}
    approved = {"approved": "{{ approval }}"}
    return workflow(
        http("ask", "POST", f"{target.url}/ask", json=asking),
        wait("approval", after=("ask",), **{"timeout_s": 30, **fields}),
        http("ship", "PUT", f"{target.url}/ship", after=("approval",), json=approved),
        name="approval",
    )


def resume_url(target: Target, index: int = 0) -> str:
    """The resume URL the workflow sent to the chat service."""
    asks = wait_for(lambda: len(target.requests_to("/ask")) > index, message="the ask request")
    assert asks
    return str(target.requests_to("/ask")[index].json()["url"])


def post(url: str, body: Any, **headers: str) -> requests.Response:
    return requests.post(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        timeout=10,
    )


def waiting(client: Api, target: Target, **fields: Any) -> tuple[str, str]:
    """Publish, start one execution, and return it and its resume URL once it waits."""
    client.publish("approval", approval(target, **fields))
    eid = client.start("approval", {"order": 7})
    client.wait(eid, "waiting")
    return eid, resume_url(target)


def kinds(execution: dict[str, Any], step_id: str) -> list[str]:
    return [e["kind"] for e in execution["events"] if e["step"] == step_id]


def test_a_resume_during_the_wait_goes_on_and_only_the_first_body_counts(
    client: Api, target: Target, api: str
) -> None:
    eid, url = waiting(client, target)
    assert url.startswith(f"{api}/hooks/resume/ffw1_")
    assert "flowforge_waits_open 1.0\n" in requests.get(f"{api}/metrics", timeout=10).text
    first = post(url, {"approved": True, "by": "ana"})
    assert first.status_code == 202, first.text
    assert first.json() == {"execution_id": eid, "step": "approval", "status": "resumed"}
    done = client.wait(eid)
    assert done["status"] == "succeeded", done
    assert step(done, "approval")["output"] == {"approved": True, "by": "ana"}
    assert target.requests_to("/ship")[0].json() == {"approved": {"approved": True, "by": "ana"}}
    assert "wait.resumed" in kinds(done, "approval")

    again = post(url, {"approved": True, "by": "ana"})
    assert again.status_code == 200, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert is_problem(post(url, {"approved": False}), 409)
    assert len(target.requests_to("/ship")) == 1


def test_resumes_follow_the_webhook_body_rules(client: Api, target: Target) -> None:
    eid, url = waiting(client, target)
    wrong_type = requests.post(url, data=b"{}", headers={"Content-Type": "text/plain"}, timeout=10)
    assert is_problem(wrong_type, 415)
    big = post(url, {"x": "y" * 2_000_000})
    assert is_problem(big, 413)
    malformed = requests.post(
        url, data=b"{nope", headers={"Content-Type": "application/json"}, timeout=10
    )
    assert is_problem(malformed, 400)
    assert is_problem(post(url + "?a=1", {}), 400)
    assert client.execution(eid)["status"] == "waiting"  # none of them touched the wait
    assert post(url, {"ok": 1}).status_code == 202


def test_a_resume_that_arrives_before_the_wait_begins_is_kept(client: Api, target: Target) -> None:
    early: list[requests.Response] = []

    def answer(request: Received) -> Reply:
        if request.path == "/ask":
            # The chat service answers the callback before FlowForge saw its reply: the
            # wait step is still pending.
            early.append(post(request.json()["url"], {"approved": "early"}))
        return Reply(json={"ok": True})

    target.script = answer
    client.publish("approval", approval(target))
    eid = client.start("approval", {"order": 1})
    done = client.wait(eid)
    assert early[0].status_code == 202, early[0].text
    assert early[0].json()["status"] == "kept"
    assert done["status"] == "succeeded", done
    assert step(done, "approval")["output"] == {"approved": "early"}
    assert target.requests_to("/ship")[0].json() == {"approved": {"approved": "early"}}
    replay = post(resume_url(target), {"approved": "early"})
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize("policy", ["fail", "continue"])
def test_a_timeout_follows_on_timeout_and_a_late_resume_is_gone(
    client: Api, target: Target, policy: str
) -> None:
    client.publish("approval", approval(target, timeout_s=1, on_timeout=policy))
    eid = client.start("approval", {"order": 2})
    done = client.wait(eid)
    approval_step = step(done, "approval")
    assert "wait.timed_out" in kinds(done, "approval")
    if policy == "fail":
        assert done["status"] == "failed"
        assert approval_step["status"] == "failed"
        assert "timed out" in approval_step["error"]
        assert step(done, "ship")["status"] == "cancelled"
        assert target.requests_to("/ship") == []
    else:
        assert done["status"] == "succeeded"
        assert approval_step["status"] == "succeeded" and approval_step["output"] is None
        assert target.requests_to("/ship")[0].json() == {"approved": None}
    assert is_problem(post(resume_url(target), {"approved": True}), 410)


def test_cancel_stops_a_wait_at_once(client: Api, target: Target) -> None:
    eid, url = waiting(client, target)
    cancelled = client.post(f"/api/v1/executions/{eid}/cancel")
    assert cancelled.json()["status"] == "cancelled"
    assert step(client.execution(eid), "approval")["status"] == "cancelled"
    assert is_problem(post(url, {"approved": True}), 410)
    assert target.requests_to("/ship") == []


def test_twenty_racing_resumes_one_wins(client: Api, target: Target) -> None:
    eid, url = waiting(client, target)
    start = threading.Barrier(20)

    def send(i: int) -> tuple[dict[str, str], requests.Response]:
        body = {"choice": "yes" if i % 2 else "no"}
        start.wait()
        return body, post(url, body)

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(send, range(20)))
    won = [body for body, r in results if r.status_code == 202]
    assert len(won) == 1, [r.status_code for _, r in results]
    for body, r in results:
        if r.status_code == 202:
            continue
        if body == won[0]:
            assert r.status_code == 200 and r.headers["Idempotent-Replayed"] == "true"
        else:
            assert is_problem(r, 409)
    done = client.wait(eid)
    assert step(done, "approval")["output"] == won[0]
    assert len(target.requests_to("/ship")) == 1
    assert kinds(done, "approval").count("wait.resumed") == 1


def _raw(token: str) -> bytes:
    body = token.removeprefix("ffw1_")
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


def _spell(raw: bytes) -> str:
    return "ffw1_" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_guessed_and_transplanted_tokens_are_404(client: Api, target: Target, api: str) -> None:
    client.publish("approval", approval(target))
    first = client.start("approval", {"order": 1})
    second = client.start("approval", {"order": 2})
    client.wait(first, "waiting")
    client.wait(second, "waiting")
    by_order = {r.json()["order"]: r.json()["url"] for r in target.requests_to("/ask")}
    token_of_first = by_order[1].rsplit("/", 1)[1]
    # The MAC of the first execution's step under the id of the second: a forgery.
    transplanted = _spell(uuid.UUID(second).bytes + _raw(token_of_first)[16:])
    guessed = _spell(os.urandom(16) + os.urandom(32) + b"approval")
    nobody = _spell(uuid.UUID(int=1).bytes + _raw(token_of_first)[16:])
    answers = [
        post(f"{api}/hooks/resume/{token}", {"approved": True})
        for token in (transplanted, guessed, nobody, "ffw1_x", "not-a-token")
    ]
    assert all(is_problem(r, 404) for r in answers), [r.status_code for r in answers]
    # Every refusal is the same answer: none says whether an execution exists.
    assert len({json.dumps(r.json(), sort_keys=True) for r in answers}) == 1
    assert client.execution(second)["status"] == "waiting"

    assert post(by_order[1], {"approved": True}).status_code == 202
    assert client.wait(first)["status"] == "succeeded"
    assert client.execution(second)["status"] == "waiting"


def test_the_token_never_lands_in_the_database_logs_or_api_output(
    client: Api,
    target: Target,
    database_url: str,
    tmp_path: Path,
) -> None:
    def answer(request: Received) -> Reply:
        if request.path == "/ask":
            # A chat service that echoes what it was sent, URL included.
            return Reply(json={"echo": request.json()["url"]}, headers={"X-Request-Id": "x"})
        return Reply(json={"ok": True})

    target.script = answer
    eid, url = waiting(client, target)
    token = url.rsplit("/", 1)[1]
    assert post(url, {"note": "thanks"}).status_code == 202
    done = client.wait(eid)
    assert done["status"] == "succeeded"
    assert step(done, "ask")["output"]["body"]["echo"].endswith("/hooks/resume/[redacted]")
    # The attempt's record of what it sent and what came back holds the URL redacted too.
    [asked] = step(done, "ask")["attempts"]
    assert "/hooks/resume/[redacted]" in asked["request"]["body"]
    assert "/hooks/resume/[redacted]" in asked["response"]["body"]

    assert token not in json.dumps(done)
    listing = client.session.get(f"{client.base}/api/v1/executions", timeout=10)
    assert token not in listing.text
    dump = subprocess.run(
        ["pg_dump", "--data-only", database_url], capture_output=True, text=True, timeout=60
    )
    assert dump.returncode == 0, dump.stderr
    assert "ffw1_" not in dump.stdout and token not in dump.stdout
    # Every process this test started wrote its log under tmp_path.
    logs = {path.name: path.read_text(errors="replace") for path in tmp_path.glob("*.log")}
    assert {"api.log", "worker-0.log"} <= set(logs)
    for name, text in logs.items():
        assert token not in text, name
    assert "/hooks/resume/[redacted]" in logs["api.log"]


def test_operators_complete_and_fail_a_wait_with_their_name_in_the_history(
    client: Api, target: Target, env: dict[str, str], db: psycopg.Connection
) -> None:
    eid, url = waiting(client, target)
    base = f"/api/v1/executions/{eid}/steps"
    assert is_problem(client.post(f"{base}/ship/complete", {"output": 1}), 409)
    assert is_problem(client.post(f"{base}/nope/complete", {"output": 1}), 404)
    assert is_problem(client.post(f"{base}/approval/complete", {"outcome": 1}), 422)
    done = client.post(f"{base}/approval/complete", {"output": {"by": "hand"}})
    assert done.status_code == 200, done.text
    finished = client.wait(eid)
    assert finished["status"] == "succeeded"
    assert step(finished, "approval")["output"] == {"by": "hand"}
    completed = [e for e in finished["events"] if e["kind"] == "wait.completed"]
    key_id, key_name = db.execute("SELECT id, name FROM api_keys").fetchone()  # type: ignore[misc]
    assert completed[0]["detail"]["actor"] == {"kind": "api_key", "id": key_id, "name": key_name}
    assert is_problem(post(url, {"late": True}), 410)

    second = client.start("approval", {"order": 8})
    client.wait(second, "waiting")
    failed = cli(env, "fail", second, "approval")
    assert failed.returncode == 0, failed.stderr
    finished = client.wait(second)
    assert finished["status"] == "failed"
    actor = next(e for e in finished["events"] if e["kind"] == "wait.failed")["detail"]["actor"]
    assert actor["kind"] == "cli" and actor["name"].startswith("cli@")
    assert target.requests_to("/ship") and len(target.requests_to("/ship")) == 1

    third = client.start("approval", {"order": 9})
    client.wait(third, "waiting")
    completed_cli = cli(env, "complete", third, "approval", '{"ok": true}')
    assert completed_cli.returncode == 0, completed_cli.stderr
    assert step(client.wait(third), "approval")["output"] == {"ok": True}
    again = cli(env, "complete", third, "approval")
    assert again.returncode == 1 and "only a waiting wait step" in again.stderr


def test_scoped_and_read_only_keys_may_not_complete_other_waits(
    client: Api, target: Target, db: psycopg.Connection, api: str
) -> None:
    from flowforge.store import apikeys

    eid, _ = waiting(client, target)
    for key in (
        apikeys.create(db, "other", ["other"])[1],
        apikeys.create(db, "reader", None, True)[1],
    ):
        r = requests.post(
            f"{api}/api/v1/executions/{eid}/steps/approval/complete",
            json={"output": 1},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
        assert is_problem(r, 403)
    assert client.execution(eid)["status"] == "waiting"


def test_a_signed_wait_takes_only_signed_resumes(client: Api, target: Target) -> None:
    client.publish("approval", approval(target, auth="signature"))
    created = client.post("/api/v1/workflows/approval/webhook-secrets")
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]
    eid = client.start("approval", {"order": 3})
    client.wait(eid, "waiting")
    url = resume_url(target)
    body = json.dumps({"approved": True}).encode()
    headers = {"Content-Type": "application/json"}
    assert is_problem(requests.post(url, data=body, headers=headers, timeout=10), 401)
    forged = signed_headers("whsec_" + base64.b64encode(b"x" * 24).decode(), "m1", body)
    assert is_problem(requests.post(url, data=body, headers={**headers, **forged}, timeout=10), 401)
    assert client.execution(eid)["status"] == "waiting"
    signed = signed_headers(secret, "m2", body)
    ok = requests.post(url, data=body, headers={**headers, **signed}, timeout=10)
    assert ok.status_code == 202, ok.text
    assert client.wait(eid)["status"] == "succeeded"


@pytest.fixture
def bare_client(api: str, api_key: str) -> Iterator[Api]:
    yield Api(api, api_key)


def test_without_a_public_url_the_step_fails_saying_why(
    bare_client: Api, target: Target, workers: Callable[..., Process]
) -> None:
    workers()  # no FLOWFORGE_PUBLIC_URL
    bare_client.publish("approval", approval(target))
    done = bare_client.wait(bare_client.start("approval", {"order": 4}))
    assert done["status"] == "failed"
    assert "FLOWFORGE_PUBLIC_URL is not set" in step(done, "ask")["error"]
    assert target.requests_to("/ask") == []


def test_publishing_checks_what_waits_name(app_client: Any, db: psycopg.Connection) -> None:
    from flowforge.store import apikeys

    key = apikeys.create(db, "t")[1]
    definition = {
        "name": "t",
        "steps": [
            {
                "id": "ask",
                "type": "http_request",
                "request": {"method": "POST", "url": "https://x.example/{{ waits.nope.url }}"},
            },
            {"id": "approval", "type": "wait", "timeout_s": 0, "on_timeout": "maybe"},
        ],
    }
    r = app_client.post(
        "/api/v1/workflows/w/versions", json=definition, headers={"Authorization": f"Bearer {key}"}
    )
    assert r.status_code == 422
    paths = [e["path"] for e in r.get_json()["errors"]]
    assert paths == ["$.steps[0].request.url", "$.steps[1].timeout_s", "$.steps[1].on_timeout"]


def _urls_of(target: Target, order: int) -> list[str]:
    return [r.json()["url"] for r in target.requests_to("/ask") if r.json()["order"] == order]


def test_a_retried_wait_reopens_under_a_new_url_and_the_old_one_is_gone(
    client: Api, target: Target
) -> None:
    # Round 1: the chat service gets the URL, then refuses the request; the execution fails
    # before its wait begins. Whoever saw that first URL must not resume the retried wait.
    def answer(request: Received) -> Reply:
        first_ask = request.path == "/ask" and len(_urls_of(target, 3)) == 1
        if first_ask and request.json()["order"] == 3:
            return Reply(status=400, json={"no": 1})
        return Reply(json={"ok": True})

    target.script = answer
    client.publish("approval", approval(target))
    eid = client.start("approval", {"order": 3})
    assert client.wait(eid)["status"] == "failed"
    assert client.post(f"/api/v1/executions/{eid}/retry").status_code == 202
    client.wait(eid, "waiting")
    wait_for(lambda: len(_urls_of(target, 3)) == 2, message="the second ask")
    leaked, second = _urls_of(target, 3)
    assert second != leaked
    assert is_problem(post(leaked, {"approved": "by the leak"}), 410)
    assert client.execution(eid)["status"] == "waiting"
    assert post(second, {"approved": "ana"}).status_code == 202
    done = client.wait(eid)
    assert done["status"] == "succeeded"
    assert step(done, "approval")["output"] == {"approved": "ana"}

    # A wait that timed out and is retried reopens too: the URL of its first wait is gone.
    client.publish("approval", approval(target, timeout_s=1, on_timeout="fail"))
    timed = client.start("approval", {"order": 4})
    assert client.wait(timed)["status"] == "failed"
    assert client.post(f"/api/v1/executions/{timed}/retry").status_code == 202
    client.wait(timed, "waiting")
    assert is_problem(post(_urls_of(target, 4)[0], {"approved": "late"}), 410)
