"""`flowforge test` (flowforge/steps/offline.py, flowforge/cli/testing.py): fixtures run
through the production engine with a fake clock, no database, broker or network."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from flowforge.cli.run import main
from flowforge.domain.definitions import parse_definition
from flowforge.steps.fixtures import parse_cases
from flowforge.steps.offline import run_case

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.json"))
SECRET = "s3cr3t-t0ken-4711"


def _write(path: Path, document: Any) -> str:
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


def test_every_example_passes_its_fixtures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test", *map(str, EXAMPLES)]) == 0
    out = capsys.readouterr().out
    assert "0 failed" in out
    assert out.count("ok   ") >= len(EXAMPLES)


def test_a_wrong_expectation_fails_and_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixture = json.loads((ROOT / "docs/examples/fixtures/charge.json").read_text())
    fixture["cases"][0]["expect"]["steps"]["receipt"]["output"]["payment_status"] = 200
    report = tmp_path / "report.xml"
    status = main(
        [
            "test",
            str(ROOT / "docs/examples/charge.json"),
            "--fixture",
            _write(tmp_path / "f.json", fixture),
            "--junit",
            str(report),
        ]
    )
    assert status == 1
    out = capsys.readouterr().out
    assert "steps.receipt.output.payment_status: expected 200, got 201" in out
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("tests") == "2"


def test_an_invalid_fixture_is_refused_with_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = {"input": {}, "targets": [{"url": "x", "answers": [{"status": 999}]}], "expct": {}}
    status = main(["test", str(EXAMPLES[0]), "--fixture", _write(tmp_path / "bad.json", bad)])
    assert status == 2
    err = capsys.readouterr().err
    assert "$.targets[0].answers[0].status" in err
    assert "$.expct: unknown field" in err


def _definition(request: dict[str, Any], **step: Any) -> Any:
    return parse_definition(
        {"name": "t", "steps": [{"id": "call", "type": "http_request", "request": request, **step}]}
    )


def test_retries_and_delays_take_no_time_but_advance_the_fake_clock() -> None:
    definition = _definition(
        {"method": "GET", "url": "https://a.example/x"},
        retry={"max_attempts": 4, "initial_interval_s": 60},
    )
    (case,) = parse_cases(
        {"targets": [{"url": "https://a.example/*", "answers": [503, 503, 429, 200]}]}
    )
    result = run_case(definition, case, workflow="t")
    assert result.status == "succeeded"
    assert result.steps["call"]["attempts"] == 4
    assert result.elapsed_s >= 60 / 2 + 120 / 2 + 240 / 2  # equal-jitter back-off, faked


def test_a_lost_answer_makes_an_unsafe_request_unknown_and_a_safe_one_retry() -> None:
    lost = {"targets": [{"url": "*", "answers": ["lost", 200]}]}
    unsafe = run_case(
        _definition({"method": "POST", "url": "https://a.example/"}),
        *parse_cases(lost),
        workflow="t",
    )
    assert unsafe.steps["call"]["status"] == "unknown" and len(unsafe.requests) == 1
    safe = run_case(
        _definition({"method": "GET", "url": "https://a.example/"}, retry={"max_attempts": 2}),
        *parse_cases(lost),
        workflow="t",
    )
    assert safe.steps["call"]["status"] == "succeeded" and len(safe.requests) == 2


def test_a_slow_answer_past_the_timeout_is_no_answer() -> None:
    definition = _definition({"method": "POST", "url": "https://a.example/", "timeout_s": 2})
    (case,) = parse_cases({"targets": [{"url": "*", "answers": [{"delay_s": 5}]}]})
    assert run_case(definition, case, workflow="t").steps["call"]["status"] == "unknown"


def test_secrets_are_redacted_where_the_worker_redacts_them() -> None:
    definition = _definition(
        {
            "method": "POST",
            "url": "https://a.example/",
            "headers": {"Authorization": "Bearer {{ secrets.partner }}"},
            "json": {"echo": "{{ secrets.partner }}"},
        }
    )
    (case,) = parse_cases(
        {
            "secrets": {"partner": SECRET},
            "targets": [{"url": "*", "answers": [{"json": {"you_sent": SECRET}}]}],
        }
    )
    result = run_case(definition, case, workflow="t")
    assert result.status == "succeeded"
    assert SECRET not in json.dumps(result.as_dict())
    assert result.requests[0].headers["Authorization"] == "Bearer [redacted]"


def test_a_request_no_target_answers_is_a_difference() -> None:
    definition = _definition({"method": "GET", "url": "https://a.example/"})
    (case,) = parse_cases({"targets": [{"url": "https://b.example/*"}]})
    result = run_case(definition, case, workflow="t")
    assert result.problems == ["call: no target answers GET https://a.example/"]
    assert result.steps["call"]["status"] == "failed"
