"""Wait steps without a database: validation, resume tokens, and the engine's rules."""

from __future__ import annotations

import base64
import uuid
from datetime import timedelta
from typing import Any

import pytest

from flowforge.domain.definitions import DefinitionInvalid, parse_definition
from flowforge.domain.templating import TemplateError
from flowforge.steps.http_step import render_request
from flowforge.store.config import ConfigError, Settings
from flowforge.trust import resume_tokens
from tests.unit.test_engine import NOW, make_run, statuses

KEY = bytes(range(32))
EID = "0190f0a0-0000-7000-8000-000000000001"


def wait(step_id: str = "approval", *parents: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": step_id,
        "type": "wait",
        "timeout_s": 60,
        **({"depends_on": list(parents)} if parents else {}),
        **extra,
    }


def ask(url: str = "{{ waits.approval.url }}", **extra: Any) -> dict[str, Any]:
    return {
        "id": "ask",
        "type": "http_request",
        "request": {"method": "POST", "url": "https://chat.example.com/post", "json": {"u": url}},
        **extra,
    }


def errors(steps: list[dict[str, Any]]) -> list[dict[str, str]]:
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition({"name": "t", "steps": steps})
    return caught.value.errors


# --- validation -------------------------------------------------------------------------


def test_the_spec_example_parses() -> None:
    definition = parse_definition(
        {"name": "t", "steps": [ask(), wait("approval", "ask", on_timeout="fail")]}
    )
    step = definition.step("approval")
    assert (step.type, step.timeout_s, step.on_timeout, step.resume_auth) == (
        "wait",
        60,
        "fail",
        "token",
    )
    assert definition.wait_steps() == ("approval",)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("timeout_s", 0, "timeout_s is required"),
        ("timeout_s", "60", "timeout_s is required"),
        ("timeout_s", True, "timeout_s is required"),
        ("timeout_s", 31_536_001, "timeout_s is required"),
        ("on_timeout", "retry", "on_timeout must be"),
        ("auth", "none", "auth must be"),
        ("duration_s", 3, "unknown key"),
    ],
)
def test_bad_wait_fields_are_named_by_json_path(field: str, value: Any, message: str) -> None:
    found = errors([wait(**{field: value})])
    assert [e["path"] for e in found] == [f"$.steps[0].{field}"]
    assert message in found[0]["message"]


def test_timeout_is_required() -> None:
    step = wait()
    del step["timeout_s"]
    assert [e["path"] for e in errors([step])] == ["$.steps[0].timeout_s"]


def test_waits_must_name_a_wait_step_of_the_workflow() -> None:
    found = errors([ask("{{ waits.nope.url }}"), wait()])
    assert found[0]["path"] == "$.steps[0].request.json.u"
    assert "'nope' is not a wait step" in found[0]["message"]
    found = errors([ask("{{ waits.ask.url }}"), wait()])
    assert "'ask' is not a wait step" in found[0]["message"]
    found = errors([ask("{{ waits.approval.token }}"), wait()])
    assert "waits.STEP.url" in found[0]["message"]


def test_waits_are_refused_where_outputs_are_stored() -> None:
    found = errors([wait(), {"id": "t", "type": "transform", "output": "{{ waits.approval.url }}"}])
    assert found[0]["path"] == "$.steps[1].output"
    assert "only be used in http_request" in found[0]["message"]


def test_waits_is_reserved() -> None:
    assert "reserved" in errors([wait("waits")])[0]["message"]


# --- tokens -----------------------------------------------------------------------------


def test_a_token_names_its_execution_and_step() -> None:
    token = resume_tokens.token(KEY, EID, "approval")
    assert token.startswith("ffw1_")
    assert resume_tokens.verify(KEY, token) == (EID, "approval", 0)
    assert EID.replace("-", "") not in token  # opaque: not the id in clear either


def test_each_round_of_a_wait_has_its_own_token() -> None:
    first, second = (
        resume_tokens.token(KEY, EID, "approval"),
        resume_tokens.token(KEY, EID, "approval", 1),
    )
    assert first != second
    assert resume_tokens.verify(KEY, second) == (EID, "approval", 1)
    raw = _raw(second)
    raw[-1:] = b"2"  # the MAC of round 1 claimed for round 2
    assert resume_tokens.verify(KEY, _spell(raw)) is None
    for spelling in (b".01", b".0", b".", b".1.1", b".-1"):  # one spelling per round
        raw = _raw(first) + spelling
        assert resume_tokens.verify(KEY, _spell(raw)) is None


def _raw(token: str) -> bytearray:
    body = token.removeprefix("ffw1_")
    return bytearray(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


def _spell(raw: bytes) -> str:
    return "ffw1_" + base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def test_forged_and_altered_tokens_are_refused() -> None:
    token = resume_tokens.token(KEY, EID, "approval")
    other = str(uuid.uuid4())
    raw = _raw(token)
    raw[:16] = uuid.UUID(other).bytes  # the MAC of one execution, the id of another
    assert resume_tokens.verify(KEY, _spell(raw)) is None
    raw = _raw(token)
    raw[-1:] = b"x"  # another step
    assert resume_tokens.verify(KEY, _spell(raw)) is None
    raw = _raw(token)
    raw[20] ^= 1  # one bit of the MAC
    assert resume_tokens.verify(KEY, _spell(raw)) is None
    assert resume_tokens.verify(bytes(32), token) is None  # another deployment's key
    for junk in ("", "ffw1_", "ffw1_AAAA", token[:-1] + "!", token + "/x", "x" * 300):
        assert resume_tokens.verify(KEY, junk) is None


def test_tokens_carry_at_least_128_bits_of_mac() -> None:
    assert len(_raw(resume_tokens.token(KEY, EID, "a"))) - 16 - 1 >= 16


def test_rendering_needs_a_public_url_and_a_key() -> None:
    definition = parse_definition({"name": "t", "steps": [ask(), wait("approval", "ask")]})
    step = definition.step("ask")
    context = {"input": {}, "execution": {"id": EID, "workflow": "wf", "version": 1}}
    with pytest.raises(TemplateError, match="FLOWFORGE_PUBLIC_URL is not set"):
        render_request(step, context, {}, resume_tokens.ResumeUrls(None, KEY))
    with pytest.raises(TemplateError, match="FLOWFORGE_RESUME_KEY is not set"):
        render_request(step, context, {}, resume_tokens.ResumeUrls("https://ff.example", None))
    with pytest.raises(TemplateError, match="FLOWFORGE_PUBLIC_URL"):
        render_request(step, context, {}, None)
    rendered = render_request(
        step, context, {}, resume_tokens.ResumeUrls("https://ff.example", KEY)
    )
    token = resume_tokens.token(KEY, EID, "approval")
    assert rendered.body is not None
    assert f"https://ff.example/hooks/resume/{token}".encode() in rendered.body
    assert rendered.redactor is not None
    assert rendered.redactor.sub("[redacted]", f"echo {token}") == "echo [redacted]"


def test_public_url_and_resume_key_configuration() -> None:
    settings = Settings.from_env(
        {"FLOWFORGE_PUBLIC_URL": "https://ff.example/", "FLOWFORGE_RESUME_KEY": "A" * 43}
    )
    assert settings.public_url == "https://ff.example"
    assert settings.resume_key is not None and len(settings.resume_key) == 32
    assert "resume_key" not in repr(settings)
    for bad in ("ftp://x", "https://x/?a=1", "example.com"):
        with pytest.raises(ConfigError, match="FLOWFORGE_PUBLIC_URL"):
            Settings.from_env({"FLOWFORGE_PUBLIC_URL": bad})
    with pytest.raises(ConfigError, match="FLOWFORGE_RESUME_KEY"):
        Settings.from_env({"FLOWFORGE_RESUME_KEY": "short"})


def test_access_logs_never_hold_a_token() -> None:
    assert resume_tokens.loggable_path("/hooks/resume/ffw1_secret") == "/hooks/resume/[redacted]"
    assert resume_tokens.loggable_path("/hooks/orders") == "/hooks/orders"


# --- engine -----------------------------------------------------------------------------


def test_a_wait_is_a_waiting_row_with_its_timeout_as_wake_at() -> None:
    run = make_run([wait()])
    run.advance()
    state = run.steps["approval"]
    assert (state.status, state.wake_at, run.status) == (
        "waiting",
        NOW + timedelta(seconds=60),
        "waiting",
    )
    assert run.dispatch == [] and run.new_attempts == []  # no message, no attempt, no lease
    assert run.wait_open("approval")


def test_a_resume_succeeds_the_step_and_the_execution_goes_on() -> None:
    run = make_run(
        [
            wait(),
            {
                "id": "after",
                "type": "transform",
                "depends_on": ["approval"],
                "output": "{{ approval.ok }}",
            },
        ]
    )
    run.advance()
    run.resume("approval", {"ok": True})
    assert statuses(run) == {"approval": "succeeded", "after": "succeeded"}
    assert run.steps["after"].output is True
    assert run.status == "succeeded"


def test_an_early_resume_is_taken_when_the_step_starts() -> None:
    run = make_run([{"id": "first", "type": "delay", "duration_s": 10}, wait("approval", "first")])
    run.advance()
    assert run.wait_not_started("approval") and not run.wait_open("approval")
    run.early_resumes = {"approval": {"ok": 1}}
    run.steps["first"].status = "ready"  # the timer woke the delay
    run.advance()
    assert run.steps["approval"].status == "succeeded"
    assert run.steps["approval"].output == {"ok": 1}
    assert run.take_changes().applied_resumes == ["approval"]


@pytest.mark.parametrize(
    ("policy", "step_status", "run_status"),
    [("continue", "succeeded", "succeeded"), ("fail", "failed", "failed")],
)
def test_timeout_follows_on_timeout(policy: str, step_status: str, run_status: str) -> None:
    run = make_run([wait(on_timeout=policy)])
    run.advance()
    run.now = NOW + timedelta(seconds=61)
    assert not run.wait_open("approval")
    run.steps["approval"].status = "ready"  # what the timer scanner does when it is due
    run.advance()
    state = run.steps["approval"]
    assert (state.status, state.output, run.status) == (step_status, None, run_status)
    assert any(kind == "wait.timed_out" for _, kind, _ in run.events)


def test_cancel_stops_a_wait_at_once() -> None:
    run = make_run([wait()])
    run.advance()
    run.cancel(actor={"kind": "cli", "name": "cli@box"})
    assert run.steps["approval"].status == "cancelled"
    assert run.status == "cancelled"
    assert not run.wait_open("approval") and not run.wait_not_started("approval")


def test_an_operator_completion_and_failure_name_the_actor() -> None:
    actor = {"kind": "api_key", "id": 3, "name": "ops"}
    run = make_run([wait()])
    run.advance()
    run.resume("approval", {"by": "hand"}, actor=actor)
    assert ("approval", "wait.completed", {"actor": actor}) in run.events
    run = make_run([wait()])
    run.advance()
    run.fail_wait("approval", actor)
    assert run.steps["approval"].status == "failed" and run.status == "failed"
    assert "ops" in (run.steps["approval"].error or "")
