"""`flowforge executions export` (flowforge/steps/recording.py): the fixture of an
execution document, and its last line of defence — every spelling the redaction tests use
of every secret the exporter knows, and every resume token, cut out."""

from __future__ import annotations

import json
from typing import Any

from flowforge.steps.fixtures import LOST, parse_cases
from flowforge.steps.http_step import redactor
from flowforge.steps.recording import REMOVED_TOKEN, as_fixture, scrubbed
from tests.unit.test_redaction import ENCODINGS, NESTED_ENCODINGS

SECRET = "Sk_live&4/7<x>+y'z-0451"
SPELLINGS = {**ENCODINGS, **NESTED_ENCODINGS}
TOKEN = "ffw1_AaJSF7OIeHmMqS5BFaCc-YXBwcm92YWw"


def execution(echo: str) -> dict[str, Any]:
    request = {
        "method": "POST",
        "url": "https://partner.example/orders",
        "headers": {"Content-Type": "application/json"},
        "body": json.dumps({"resume": f"https://ff.example/hooks/resume/{TOKEN}"}),
        "truncated": False,
    }
    return {
        "id": "01a233ee-a3de-71f1-8ccd-4191093a47ad",
        "workflow": "partner",
        "version": 3,
        "status": "needs_attention",
        "input": {"order": 1, "note": echo},
        "created_at": "2026-12-01T09:00:00+00:00",
        "events": [],
        "steps": [
            {
                "id": "call",
                "type": "http_request",
                "status": "succeeded",
                "output": {"status": 201, "body": echo},
                "attempts": [
                    {
                        "attempt": 1,
                        "started_at": "2026-12-01T09:00:01+00:00",
                        "request": request,
                        "response": {"status": 503, "headers": {}, "body": echo},
                    },
                    {
                        "attempt": 2,
                        "started_at": "2026-12-01T09:00:02+00:00",
                        "request": request,
                        "response": None,
                    },
                ],
            }
        ],
    }


def test_every_spelling_of_a_known_secret_and_every_resume_token_is_cut_out() -> None:
    echo = " | ".join(spell(SECRET) for spell in SPELLINGS.values())
    definition = {"steps": [{"request": {"headers": {"A": "{{ secrets.partner }}"}}}]}
    text = scrubbed(as_fixture(execution(echo), definition), [SECRET])
    for name, spell in SPELLINGS.items():
        assert spell(SECRET) not in text, name
    found = redactor([SECRET])
    assert found is not None and not found.reveals(text)
    assert TOKEN not in text and REMOVED_TOKEN in text
    fixture = json.loads(text)
    assert fixture["secrets"] == {"partner": "test-value-of-partner"}
    (case,) = parse_cases(fixture)  # a valid fixture
    assert case.targets[0].answers[1].lost and LOST == "lost"
    assert fixture["expect"]["steps"]["call"]["status"] == "succeeded"
    assert [r["step"] for r in fixture["expect"]["requests"]] == ["call", "call"]
