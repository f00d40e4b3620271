"""`flowforge test` is the real engine: every example in docs/examples/ runs both offline
(flowforge/steps/offline.py) and through a real bin/api + bin/worker against a 127.0.0.1
target that answers what the fixture says, and the two give the same statuses, outputs,
attempts and requests (as the attempts recorded them, and as the target received them).

The fixture's hosts (*.example.com) are pointed at the target; a `lost` answer is a reply
held past the request's timeout. A case whose real run would take longer than
REAL_TIME_S (a wait that times out after a day) is run offline only: it is named below."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flowforge.domain.definitions import parse_definition
from flowforge.steps.fixtures import Case, parse_cases
from flowforge.steps.offline import OfflineRun
from flowforge.trust import resume_tokens
from tests.faults.helpers import signed_headers
from tests.support.api import Api
from tests.support.processes import TEST_RESUME_KEY, Process, wait_for
from tests.support.target import Received, Reply, Target

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.json"))
HOSTS = re.compile(r"https://[a-z.]+\.example\.com")
REAL_TIME_S = 30
TOO_LONG = {("approval", "no one answers within a day")}


def _cases() -> list[tuple[str, str]]:
    found = []
    for path in EXAMPLES:
        fixture = json.loads((path.parent / "fixtures" / path.name).read_text())
        for case in parse_cases(fixture, path.stem):
            if (path.stem, case.name) not in TOO_LONG:
                found.append((path.stem, case.name))
    return found


@pytest.fixture
def client(api: str, api_key: str, workers: Callable[..., Process]) -> Api:
    workers(FLOWFORGE_PUBLIC_URL=api)
    return Api(api, api_key)


def _pointed(path: Path, target: Target) -> Any:
    return json.loads(HOSTS.sub(target.url, path.read_text()))


def _answers(case: Case, target: Target) -> Callable[[Received], Reply]:
    """The target's script: the fixture's answers, in order, as the offline run takes them."""

    def answer(request: Received) -> Reply:
        found = case.answer(request.method, target.url + request.path)
        assert found is not None, f"no fixture answer for {request.method} {request.path}"
        if found.lost:
            return Reply(status=200, delay_s=3.0)  # past every example's timeout_s
        return Reply(
            status=found.status, body=found.body, headers=found.headers, delay_s=found.delay_s
        )

    return answer


def _comparable(execution: dict[str, Any]) -> dict[str, Any]:
    """Statuses, outputs, attempt counts and recorded requests, minus what differs by
    nature (the instant a delay ended)."""
    steps = {}
    for s in execution["steps"]:
        output = s["output"]
        if s["type"] == "delay" and isinstance(output, dict):
            output = sorted(output)
        steps[s["id"]] = {
            "status": s["status"],
            "output": output,
            "attempts": s["attempt_count"],
            "requests": [a["request"] for a in s["attempts"] if a.get("request")],
        }
    return {"status": execution["status"], "steps": steps}


def test_offline_and_a_real_worker_agree_on_every_example(client: Api, api: str) -> None:
    """One API and worker for every case (each its own workflow key and target), so the
    whole comparison costs one start-up."""
    for index, (example, name) in enumerate(_cases()):
        target = Target()
        try:
            _agree(client, api, target, example, name, f"{example}-{index}")
        finally:
            target.close()


def _agree(client: Api, api: str, target: Target, example: str, name: str, key: str) -> None:
    path = ROOT / "docs" / "examples" / f"{example}.json"
    document = _pointed(path, target)
    fixture = _pointed(path.parent / "fixtures" / path.name, target)
    (case,) = [c for c in parse_cases(fixture, example) if c.name == name]
    client.publish(key, document)
    headers: dict[str, str] = {}
    body = json.dumps(case.input).encode()
    if document["trigger"]["webhook"]["auth"] == "signature":
        r = client.post(f"/api/v1/workflows/{key}/webhook-secrets")
        assert r.status_code == 201, r.text
        headers = signed_headers(r.json()["secret"], f"msg-{key}", body)
    target.script = _answers(case, target)
    eid = client.start(key, case.input, headers=headers, raw=body)
    if case.resumes:
        ((_step, answer),) = case.resumes.items()
        asked = wait_for(lambda: target.received, message="the resume URL sent")
        url = asked[0].json()["resume_url"]
        client.wait(eid, "waiting", timeout=REAL_TIME_S)
        assert client.session.post(url, json=answer, timeout=10).status_code == 202
    real = client.wait(eid, {"succeeded", "failed", "cancelled", "needs_attention"}, REAL_TIME_S)

    # Offline, with the fixture's answers from the start again and the real execution's id.
    (offline_case,) = [c for c in parse_cases(fixture, example) if c.name == name]
    offline_case.execution_id = eid
    resume = resume_tokens.ResumeUrls(api, resume_tokens.parse_key(TEST_RESUME_KEY))
    run = OfflineRun(parse_definition(document), offline_case, workflow=key, resume=resume)
    offline = run.run_to_end()
    assert offline.problems == [], (example, name)

    compared = _comparable(real)
    assert offline.status == compared["status"]
    for sid, step_result in offline.steps.items():
        output = step_result["output"]
        if document["steps"][[s["id"] for s in document["steps"]].index(sid)]["type"] == "delay":
            output = sorted(output)
        got = {k: step_result[k] for k in ("status", "attempts")} | {"output": output}
        wanted = compared["steps"][sid]
        assert got == {k: wanted[k] for k in ("status", "attempts", "output")}, sid
        sent = [r.as_dict() for r in offline.requests if r.step == sid]
        recorded = wanted["requests"]
        assert [(r["method"], r["url"], r["headers"], r["body"]) for r in sent] == [
            (r["method"], r["url"], r["headers"], r["body"]) for r in recorded
        ], sid
    # What the target received is what both recorded, bodies and headers, secrets aside.
    received = [(r.method, target.url + r.path, r.body.decode()) for r in target.received]
    offline_sent = [(r.method, r.url, r.body or "") for r in offline.requests]
    if "[redacted]" not in json.dumps(offline_sent):
        assert received == offline_sent
    else:
        assert [m for m, _, _ in received] == [m for m, _, _ in offline_sent]
    for r, sent_request in zip(target.received, offline.requests, strict=True):
        for header, value in sent_request.headers.items():
            if "[redacted]" not in value:
                assert r.headers[header.lower()] == value
