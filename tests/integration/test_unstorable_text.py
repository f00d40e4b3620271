"""Text PostgreSQL cannot store (a NUL; a lone surrogate where one can be spelled) in any
path parameter, query parameter or form field of any route, API and console, old and new,
is a 4xx problem and never a 500 (docs/reference/http-api.md, errors). The routes come
from the app's url_map, not from a list, and every request goes to a real bin/api: a
route added later is covered without touching this test."""

from __future__ import annotations

import re
from typing import Any

import requests
from werkzeug.routing import Rule

from tests.support.api import Api
from tests.support.definitions import OPEN

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
NUL = "%00"
# A valid value per converter, for the arguments not under test.
VALID = {"workflow_key": "open", "int": "1"}
# The console's form fields (api/console/forms.py and the action forms), each with a NUL.
FORM_FIELDS = (
    "id",
    "workflow",
    "status",
    "key",
    "value",
    "path",
    "from",
    "to",
    "next",
    "reason",
    "version",
    "from_step",
    "outcome",
    "api_key",
    "idempotency_key",
)


def url(rule: Rule, values: dict[str, str]) -> str:
    """The rule's path with each argument replaced by its (already encoded) value."""
    return re.sub(r"<(?:[^>:]+:)?([^>]+)>", lambda m: values[m.group(1)], rule.rule)


def converter_of(rule: Rule, argument: str) -> str:
    found = re.search(rf"<([^>:(]+)(?:\([^)]*\))?:{argument}>", rule.rule)
    return found.group(1) if found else "default"


def signed_in(base: str, key: str) -> tuple[requests.Session, str]:
    session = requests.Session()
    page = session.get(f"{base}/ui/signin", timeout=10)
    token = CSRF.search(page.text).group(1)
    r = session.post(
        f"{base}/ui/signin", data={"csrf": token, "api_key": key}, allow_redirects=False
    )
    assert r.status_code == 303, r.text
    listing = session.get(f"{base}/ui/executions", timeout=10)
    return session, CSRF.search(listing.text).group(1)


def test_unstorable_text_anywhere_in_any_route_is_a_4xx(
    app_client: Any, api: str, api_key: str
) -> None:
    client = Api(api, api_key)
    client.publish("open", OPEN)
    execution_id = client.start("open", {"x": 1})
    console, csrf = signed_in(api, api_key)
    rules = [r for r in app_client.application.url_map.iter_rules() if r.endpoint != "static"]
    assert len(rules) > 40  # the whole app, API and console
    answers: dict[str, int] = {}
    for rule in rules:
        is_console = rule.rule.startswith("/ui")
        session = console if is_console else client.session
        valid = {arg: VALID.get(converter_of(rule, arg), "open") for arg in rule.arguments}
        valid.update(
            (arg, execution_id)
            for arg in rule.arguments
            if converter_of(rule, arg) == "execution_id"
        )
        probes: list[tuple[str, dict[str, str]]] = []
        # Each text argument in turn carries a NUL; then the query; then a form field.
        for arg in rule.arguments:
            if converter_of(rule, arg) not in ("int", "execution_id"):
                probes.append((url(rule, {**valid, arg: f"a{NUL}b"}), {}))
        probes.append((url(rule, valid) + f"?status=a{NUL}&workflow=%ED%A0%80", {}))
        if is_console:
            fields = {name: "a\x00b" for name in FORM_FIELDS}
            probes.append((url(rule, valid), {"csrf": csrf, **fields}))
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            for path, form in probes:
                if form and method != "POST":
                    continue
                r = session.request(
                    method, f"{api}{path}", data=form or None, allow_redirects=False, timeout=30
                )
                answers[f"{method} {path} {sorted(form)}"] = r.status_code
    # Every probe carries a NUL: refused with a 4xx, never a 5xx, never accepted.
    wrong = {probe: status for probe, status in answers.items() if not 400 <= status < 500}
    assert not wrong, wrong
