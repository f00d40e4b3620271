"""Approval forms (docs/contract.md#approvals) in-process against a real database: the
declaration refused at publish with its paths, the open approvals listed per assignee (API
and console), the form rendered and submitted (422 with every bad field, nothing decided;
approve resumes with the values and who decided; reject fails the step), the API's
decision, and a machine's resume held to the same form."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from flowforge.store import apikeys
from flowforge.trust import resume_tokens
from tests.integration.test_console import CSRF, _sign_in
from tests.support.definitions import transform, wait, workflow
from tests.support.inprocess import InProcess
from tests.support.processes import TEST_RESUME_KEY

FORM = {
    "title": "Approve refund",
    "fields": {
        "type": "object",
        "properties": {
            "amount": {"type": "number", "title": "Amount", "minimum": 0, "maximum": 500},
            "reason": {"type": "string", "title": "Reason", "maxLength": 20},
            "channel": {
                "type": "string",
                "title": "Channel",
                "oneOf": [{"const": "card", "title": "Card"}, {"const": "cash", "title": "Cash"}],
            },
            "notify": {"type": "boolean", "title": "Tell the customer"},
        },
        "required": ["amount", "channel"],
    },
}
REFUND = workflow(
    wait("approve", 3600, form=FORM, assignees=["tests"]),
    transform("paid", {"amount": "{{ approve.values.amount }}"}, after=("approve",)),
    name="refund",
)


def _waiting(ff: InProcess) -> str:
    """A new execution of `refund`, run until its approval waits."""
    execution_id = ff.hook("refund", {"order": 1}).json()["execution_id"]

    def waiting() -> bool:
        steps = {s["id"]: s for s in ff.execution(execution_id)["steps"]}
        return steps["approve"]["status"] == "waiting"

    ff.until(waiting, 10, "the approval waits")
    return str(execution_id)


def _step(ff: InProcess, execution_id: str, step_id: str) -> dict[str, Any]:
    return next(s for s in ff.execution(execution_id)["steps"] if s["id"] == step_id)


def test_a_bad_form_is_refused_at_publish_with_its_paths(in_process: InProcess) -> None:
    bad = json.loads(json.dumps(REFUND))
    props = bad["steps"][0]["form"]["fields"]["properties"]
    props["amount"]["minimum"] = "zero"
    props["reason"]["pattern"] = ".*"
    props["channel"]["oneOf"][1] = {"const": 2}
    bad["steps"][0]["form"]["fields"]["required"] = ["nope"]
    bad["steps"][0]["assignees"] = ["tests", "tests"]
    r = in_process.post("/api/v1/workflows/refund/versions", bad)
    assert r.status_code == 422
    paths = {e["path"] for e in r.json()["errors"]}
    fields = "$.steps[0].form.fields"
    assert paths == {
        f"{fields}.properties.amount.minimum",
        f"{fields}.properties.reason.pattern",
        f"{fields}.properties.channel.oneOf[1]",
        f"{fields}.required",
        "$.steps[0].assignees",
    }
    r = in_process.post("/api/v1/workflows/refund/versions", {**REFUND, "steps": [
        {"id": "w", "type": "wait", "timeout_s": 60, "assignees": ["x"]}]})  # fmt: skip
    assert [e["path"] for e in r.json()["errors"]] == ["$.steps[0].assignees"]


def test_console_lists_renders_refuses_and_decides(
    in_process: InProcess, api_key: str, db: psycopg.Connection
) -> None:
    ff, app = in_process, in_process.app
    ff.publish("refund", REFUND)
    first, second = _waiting(ff), _waiting(ff)
    mine = app.get("/api/v1/approvals?assignee=tests").get_json()["approvals"]
    assert {a["execution_id"] for a in mine} == {first, second}
    assert mine[0]["form"]["fields"]["required"] == ["amount", "channel"]
    assert app.get("/api/v1/approvals?assignee=bob").get_json() == {"approvals": []}

    csrf = _sign_in(app, api_key)
    listing = app.get("/ui/approvals").get_data(as_text=True)
    assert 'href="/ui/approvals"' in listing and listing.count('class="approval"') == 2
    form_page = app.get(f"/ui/approvals/{first}/approve").get_data(as_text=True)
    assert 'name="amount"' in form_page and '<option value="cash">Cash</option>' in form_page
    assert 'type="checkbox" name="notify"' in form_page and "<script" not in form_page

    url = f"/ui/approvals/{first}/approve"
    bad = {"csrf": csrf, "decision": "approve", "amount": "900", "reason": "x" * 21}
    r = app.post(url, data=bad)
    page = r.get_data(as_text=True)
    assert r.status_code == 422
    for path in ("$.values.amount", "$.values.reason", "$.values.channel"):
        assert path in page
    assert 'value="900"' in page  # what was typed is shown again
    assert _step(ff, first, "approve")["status"] == "waiting"  # nothing decided

    good = {"csrf": csrf, "decision": "approve", "amount": "12.5", "channel": "card",
            "notify": "true"}  # fmt: skip
    r = app.post(url, data=good)
    assert r.status_code == 303 and "/ui/approvals?decided=" in r.headers["Location"]
    ff.until(lambda: ff.execution(first)["status"] == "succeeded", 10, "the execution ends")
    output = _step(ff, first, "approve")["output"]
    assert output["values"] == {"amount": 12.5, "channel": "card", "notify": True}
    assert output["decision"] == "approved" and output["decided_by"] == "tests"
    assert _step(ff, first, "paid")["output"] == {"amount": 12.5}
    (completed,) = [e for e in ff.execution(first)["events"] if e["kind"] == "wait.completed"]
    assert completed["step"] == "approve", completed
    assert json.dumps(completed).count('"tests"') >= 1  # the actor, durably in the history
    shown = app.get(f"/ui/executions/{first}").get_data(as_text=True)
    assert 'id="decided-approve"' in shown and "<b>tests</b>" in shown
    assert app.post(url, data=good).status_code == 404  # decided: no longer open

    r = app.post(f"/ui/approvals/{second}/approve", data={"csrf": csrf, "decision": "reject"})
    assert r.status_code == 303
    assert _step(ff, second, "approve")["error"] == "rejected by tests"
    assert ff.execution(second)["status"] == "failed"
    assert app.get("/ui/approvals").get_data(as_text=True).count('class="approval"') == 0
    assert CSRF.search(listing)


def test_the_api_decides_and_the_resume_url_is_held_to_the_form(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    ff, app = in_process, in_process.app
    ff.publish("refund", REFUND)
    first, second = _waiting(ff), _waiting(ff)

    r = ff.post(f"/api/v1/approvals/{first}/approve", {"decision": "approve",
                "values": {"amount": -1, "channel": "wire", "extra": 1}})  # fmt: skip
    assert r.status_code == 422 and r.headers["Content-Type"] == "application/problem+json"
    assert {e["path"] for e in r.json()["errors"]} == {
        "$.values.amount", "$.values.channel", "$.values.extra"}  # fmt: skip
    r = ff.post(f"/api/v1/approvals/{first}/approve", {"decision": "maybe"})
    assert r.status_code == 422 and r.json()["errors"][0]["path"] == "$.decision"

    bob = apikeys.create(db, "bob")[1]
    refused = app.post(
        f"/api/v1/approvals/{first}/approve",
        json={"decision": "reject"},
        headers={"Authorization": f"Bearer {bob}"},
    )
    assert refused.status_code == 403
    csrf = _sign_in(app, bob)  # the console: bob sees the form, no buttons, and may not post
    assert app.get("/ui/approvals").get_data(as_text=True).count('class="approval"') == 0
    page = app.get(f"/ui/approvals/{first}/approve").get_data(as_text=True)
    assert 'id="not-yours"' in page and 'id="approve"' not in page
    posted = app.post(f"/ui/approvals/{first}/approve", data={"csrf": csrf, "decision": "reject"})
    assert posted.status_code == 403
    assert _step(ff, first, "approve")["status"] == "waiting"

    r = ff.post(f"/api/v1/approvals/{first}/approve", {"decision": "approve",
                "values": {"amount": 3, "channel": "cash"}})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["decided_by"] == "tests" and r.json()["output"]["values"]["amount"] == 3
    again = ff.post(f"/api/v1/approvals/{first}/approve", {"decision": "reject"})
    assert again.status_code == 409

    key = resume_tokens.parse_key(TEST_RESUME_KEY)
    (round_,) = db.execute(
        "SELECT fencing_token FROM steps WHERE execution_id = %s AND step_id = 'approve'",
        (second,),
    ).fetchone()
    url = f"/hooks/resume/{resume_tokens.token(key, second, 'approve', round_)}"
    r = ff.post(url, {"amount": "3"})
    assert r.status_code == 422
    assert {e["path"] for e in r.json()["errors"]} == {"$.amount", "$.channel"}
    assert db.execute("SELECT count(*) FROM resumes").fetchone() == (0,)
    assert ff.post(url, {"amount": 3, "channel": "card"}).status_code == 202
    ff.until(lambda: ff.execution(second)["status"] == "succeeded", 10, "the resumed one ends")
    machine = _step(ff, second, "approve")["output"]
    assert machine["values"] == {"amount": 3, "channel": "card"} and machine["decided_by"] is None


def test_an_operator_not_assigned_cannot_decide_by_complete_or_fail(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    # The assignees are who may decide (docs/contract.md#approvals): the operator's
    # complete and fail, API and console, are decisions too and may not go around them.
    ff, app = in_process, in_process.app
    ff.publish("refund", REFUND)
    execution_id = _waiting(ff)
    bob = {"Authorization": f"Bearer {apikeys.create(db, 'bob', role='operator')[1]}"}
    steps = f"/api/v1/executions/{execution_id}/steps/approve"
    values = {"amount": 3, "channel": "cash"}
    done = app.post(f"{steps}/complete", json={"output": values}, headers=bob)
    assert done.status_code == 403, done.get_data(as_text=True)
    assert app.post(f"{steps}/fail", headers=bob).status_code == 403
    csrf = _sign_in(app, apikeys.create(db, "bob2", role="operator")[1])
    ui = f"/ui/executions/{execution_id}/steps/approve"
    posted = app.post(f"{ui}/complete", data={"csrf": csrf, "output": json.dumps(values)})
    assert posted.status_code == 403, posted.status_code
    assert _step(ff, execution_id, "approve")["status"] == "waiting"
    # The assignee still may.
    mine = ff.post(f"{steps}/complete", {"output": values})
    assert mine.status_code == 200, mine.text
    assert _step(ff, execution_id, "approve")["output"]["decided_by"] == "tests"


def test_a_wait_whose_form_is_null_is_no_approval_and_breaks_no_list(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    # "form": null publishes as a plain wait; the open approvals' statement must agree
    # with the parser, or one such wait makes every list answer 500.
    ff, app = in_process, in_process.app
    ff.publish("plain", workflow(wait("hold", 3600, form=None), name="plain"))
    ff.publish("refund", REFUND)
    held = ff.hook("plain", {"x": 1}).json()["execution_id"]
    ff.until(lambda: _step(ff, held, "hold")["status"] == "waiting", 10, "the wait waits")
    execution_id = _waiting(ff)
    listed = app.get("/api/v1/approvals")
    assert listed.status_code == 200, listed.get_data(as_text=True)
    assert [a["execution_id"] for a in listed.get_json()["approvals"]] == [execution_id]
    _sign_in(app, apikeys.create(db, "tests2")[1])
    assert app.get("/ui/approvals").status_code == 200
