"""docs/contract.md#safe-examples: the shipped examples and deployment files are safe as written —
what users copy must not undo the code's protections. Every example publishes (so no secret or
resume URL goes to a destination the input picks), every example that makes a decision
through a wait step takes only signed webhooks, the nginx site keeps resume tokens out of
its access log and denies /metrics, and no systemd file carries a secret in clear."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from flowforge.domain.definitions import parse_definition
from flowforge.domain.templating import find_placeholders, iter_template_strings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.json"))
NGINX = ROOT / "docs" / "nginx" / "flowforge.conf"
SYSTEMD = sorted(p for p in (ROOT / "docs" / "systemd").rglob("*") if p.is_file())


def location(config: str, match: str) -> str:
    """The body of the nginx `location <match> { ... }` block (no nested blocks in it)."""
    found = re.search(r"location\s+" + re.escape(match) + r"\s*\{([^{}]*)\}", config)
    assert found is not None, f"no `location {match}` block"
    return found.group(1)


def test_there_are_examples_to_check() -> None:
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_publishes_and_sends_credentials_only_to_fixed_places(path: Path) -> None:
    doc: dict[str, Any] = json.loads(path.read_text())
    parse_definition(doc)  # refuses a secret or resume URL sent where the input points
    for step in doc["steps"]:
        request = step.get("request")
        if not request:
            continue
        assert not request.get("allow_templated_destination"), f"{path.name}: {step['id']}"
        uses = {
            p
            for _, text in iter_template_strings(request)
            for p in find_placeholders(text)
            if p.startswith(("secrets.", "waits."))
        }
        if uses:
            origin = re.match(r"[^/]*//[^/?#]*|[^/?#]*", request["url"])
            assert origin is not None
            assert not [
                p for p in find_placeholders(origin.group()) if not p.startswith("secrets.")
            ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_that_waits_for_a_decision_takes_only_signed_webhooks(path: Path) -> None:
    doc: dict[str, Any] = json.loads(path.read_text())
    decides = any(step["type"] == "wait" for step in doc["steps"])
    webhook = doc["trigger"].get("webhook")
    if decides and webhook is not None:
        assert webhook.get("auth") == "signature", f"{path.name}: an unsigned sender decides"


def test_the_nginx_site_keeps_resume_tokens_out_of_its_log_and_denies_metrics() -> None:
    config = re.sub(r"#[^\n]*", "", NGINX.read_text())
    resume = location(config, "/hooks/resume/")
    assert re.search(r"\baccess_log\s+off\s*;", resume), resume
    metrics = location(config, "= /metrics")
    assert re.search(r"\bdeny\s+all\s*;", metrics), metrics
    assert not re.search(r"\ballow\s+all\b", config)
    # The error log would name a resume request's line (body too large, API down).
    assert re.search(r"\berror_log\s+\S+\s+(crit|alert|emerg)\s*;", resume), resume
    # A custom format never brings request lines back...
    formats = dict(re.findall(r"\blog_format\s+(\w+)\s+((?:'[^']*'\s*)+);", config))
    assert len(formats) == config.count("log_format")
    for name, text in formats.items():
        assert not re.search(
            r"\$(request|request_uri|uri|document_uri|args|query_string)\b", text
        ), name
    # ...and nginx's own refusals, logged where error_page ends them with the original
    # request line in $request, use one of those formats.
    problem = re.search(r"location\s+/\.problem/\s*\{([^{}]*)", config)
    assert problem is not None
    logged = re.search(r"\baccess_log\s+\S+\s+(\w+)\s*;", problem.group(1))
    assert logged is not None and logged.group(1) in formats, problem.group(1)


@pytest.mark.parametrize("path", SYSTEMD, ids=lambda p: p.name)
def test_no_systemd_file_holds_a_secret_in_clear(path: Path) -> None:
    for line in path.read_text().splitlines():
        setting = line.strip()
        if setting.startswith("#") or "=" not in setting:
            continue
        for name in ("FLOWFORGE_SECRET_", "FLOWFORGE_ENCRYPTION_KEY", "FLOWFORGE_RESUME_KEY"):
            assert name not in setting, f"{path.name}: {setting} (use LoadCredential)"
