"""docs/contract.md#flow-control as pure rules: validation of every flow-control option at its JSON
path, and the engine's deadline and budget transitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowforge.domain.definitions import Concurrency, DefinitionInvalid, parse_definition
from flowforge.domain.engine import Run, StepState
from flowforge.domain.model import Outcome
from flowforge.store.flowcontrol import KeyUnresolved, concurrency_key, retry_after

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GET = {"method": "GET", "url": "https://example.com/x", "timeout_s": 10}


def definition(**options: Any) -> dict[str, Any]:
    steps = options.pop("steps", [{"id": "call", "type": "http_request", "request": GET}])
    return {"name": "t", "steps": steps, **options}


def errors_of(doc: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition(doc)
    return [(e["path"], e["message"]) for e in caught.value.errors]


def test_every_option_parses() -> None:
    parsed = parse_definition(
        definition(
            concurrency={
                "limit": 2,
                "key": "{{ input.customer_id }}",
                "on_full": "cancel_oldest",
                "max_queued": 10000,
            },
            deadline_s=3600,
            start_within_s=600,
            steps=[{"id": "call", "type": "http_request", "request": GET, "budget_s": 60}],
        )
    )
    assert parsed.concurrency == Concurrency(2, "{{ input.customer_id }}", "cancel_oldest", 10000)
    assert (parsed.deadline_s, parsed.start_within_s) == (3600, 600)
    assert parsed.step("call").budget_s == 60
    assert parse_definition(definition(concurrency={"limit": 1})).concurrency == Concurrency(1)


@pytest.mark.parametrize(
    ("concurrency", "path", "fragment"),
    [
        ({"limit": 0}, "$.concurrency.limit", "integer from 1"),
        ({"limit": -3}, "$.concurrency.limit", "integer from 1"),
        ({"limit": 1.5}, "$.concurrency.limit", "integer from 1"),
        ({"limit": True}, "$.concurrency.limit", "integer from 1"),
        ({}, "$.concurrency.limit", "required"),
        ({"limit": 1, "key": "{{ secrets.token }}"}, "$.concurrency.key", "no secrets"),
        ({"limit": 1, "key": "{{ execution.id }}"}, "$.concurrency.key", "input only"),
        ({"limit": 1, "key": "{{ call.body.id }}"}, "$.concurrency.key", "input only"),
        ({"limit": 1, "key": ""}, "$.concurrency.key", "non-empty"),
        ({"limit": 1, "key": "{{ input."}, "$.concurrency.key", ""),
        ({"limit": 1, "on_full": "wait"}, "$.concurrency.on_full", "queue, drop_new"),
        ({"limit": 1, "max_queued": 0}, "$.concurrency.max_queued", "integer from 1"),
        ({"limit": 1, "burst": 3}, "$.concurrency.burst", "unknown key"),
    ],
)
def test_bad_concurrency_is_refused_at_its_path(
    concurrency: dict[str, Any], path: str, fragment: str
) -> None:
    errors = errors_of(definition(concurrency=concurrency))
    assert [p for p, _ in errors] == [path], errors
    assert fragment in errors[0][1], errors


@pytest.mark.parametrize("name", ["deadline_s", "start_within_s"])
@pytest.mark.parametrize("value", [0, -1, "60", 10**9])
def test_bad_time_limits_are_refused(name: str, value: Any) -> None:
    assert [p for p, _ in errors_of(definition(**{name: value}))] == [f"$.{name}"]


def test_a_budget_shorter_than_one_attempt_is_refused() -> None:
    steps = [{"id": "call", "type": "http_request", "request": GET, "budget_s": 5}]
    errors = errors_of(definition(steps=steps))
    assert errors == [
        ("$.steps[0].budget_s", "budget_s 5 is shorter than one attempt's timeout_s 10")
    ]


def test_the_key_renders_from_the_body_only() -> None:
    parsed = parse_definition(definition(concurrency={"limit": 1, "key": "c-{{ input.id }}"}))
    assert concurrency_key(parsed, b'{"id": 7}') == "c-7"
    with pytest.raises(KeyUnresolved):
        concurrency_key(parsed, b"{}")
    assert concurrency_key(parse_definition(definition(concurrency={"limit": 1})), b"{}") == ""
    assert concurrency_key(parse_definition(definition()), b"{}") is None


def test_retry_after_follows_the_drain_rate() -> None:
    assert retry_after(0) == 60
    assert retry_after(1) == 60
    assert retry_after(30) == 2
    assert retry_after(6000) == 1


def make_run(doc: dict[str, Any]) -> Run:
    parsed = parse_definition(doc)
    return Run(
        execution_id="00000000-0000-0000-0000-000000000001",
        workflow="wf",
        version=1,
        status="running",
        input={},
        definition=parsed,
        steps={s.id: StepState(s.id, s.type, "ready") for s in parsed.steps},
        now=NOW,
    )


def test_a_deadline_lets_the_request_in_flight_finish_then_fails_with_its_reason() -> None:
    run = make_run(
        definition(
            deadline_s=60,
            steps=[
                {"id": "call", "type": "http_request", "request": {**GET, "method": "POST"}},
                {"id": "nap", "type": "delay", "duration_s": 600},
            ],
        )
    )
    token = run.claim("call", "w").fencing_token
    run.advance()
    assert run.steps["nap"].status == "waiting"
    run.pass_deadline()
    assert run.steps["nap"].status == "cancelled"
    assert run.status == "running"
    run.record_outcome("call", token, Outcome("succeeded", output={"status": 200}))
    assert run.steps["call"].status == "succeeded"
    assert run.status == "failed"
    ended = {"from": "running", "to": "failed", "reason": "deadline"}
    assert (None, "execution.failed", ended) in run.events


def test_a_deadline_leaves_an_unknown_step_unknown() -> None:
    run = make_run(definition(deadline_s=60))
    run.claim("call", "w")
    run.mark_unknown("call", "timed out after sending")
    run.pass_deadline()
    assert run.steps["call"].status == "unknown"
    assert run.status == "failed"


def test_budget_refuses_a_retry_after_beyond_it_and_a_back_off_past_it() -> None:
    steps = [
        {
            "id": "call",
            "type": "http_request",
            "request": GET,
            "budget_s": 30,
            "retry": {"max_attempts": 10, "initial_interval_s": 20, "max_interval_s": 3600},
        }
    ]
    run = make_run(definition(steps=steps))
    token = run.claim("call", "w").fencing_token
    run.record_outcome("call", token, Outcome("retry", error="503", retry_after_s=3600))
    assert run.steps["call"].status == "failed"
    assert "Retry-After 3600 s is beyond what is left of budget_s 30" in run.steps["call"].error

    run = make_run(definition(steps=steps))
    token = run.claim("call", "w").fencing_token
    run.now = NOW + timedelta(seconds=25)
    assert run.attempt_timeout("call", 10) == 5
    run.record_outcome("call", token, Outcome("retry", error="503"))
    assert run.steps["call"].status == "failed"
    assert "would start after budget_s 30 ran out" in run.steps["call"].error
