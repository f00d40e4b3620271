"""The fixture format of `flowforge test` (docs/reference/testing.md): what one offline
run is given (an input, the answers of the targets, the resumes of wait steps, test
values of secrets) and what it must show (the execution's and steps' statuses and
outputs, the requests sent). Parsed strictly, each problem with its JSON path, so a typo
in a fixture fails the test run instead of passing a test that checks nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from flowforge.errors import ClientError

# What a fixture answers in place of a response: the request may have left and no answer
# came back (the worker's SentNoResponse), so an unsafe request's step is `unknown`.
LOST = "lost"
_CASE_KEYS = frozenset(
    {
        "name",
        "input",
        "targets",
        "resumes",
        "secrets",
        "expect",
        "execution_id",
        "now",
        "public_url",
    }
)
_ANSWER_KEYS = frozenset({"status", "headers", "json", "body", "delay_s", "lost"})
_TARGET_KEYS = frozenset({"method", "url", "answers"})
_EXPECT_KEYS = frozenset({"status", "steps", "requests"})
DEFAULT_NOW = "2026-01-01T00:00:00+00:00"


class FixtureInvalid(ClientError):
    """A fixture file breaks the format; each problem has its JSON path."""

    status = 422
    title = "Invalid fixture"

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{e['path']}: {e['message']}" for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class Answer:
    """One answer of a target: a response after `delay_s` (fake) seconds, or lost."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay_s: float = 0.0
    lost: bool = False


@dataclass
class Target:
    """The requests one method and URL pattern (a glob: `*` matches any text) answer: the
    answers in order, the last one again for every request after them."""

    method: str
    url: str
    answers: list[Answer]
    used: int = 0

    def matches(self, method: str, url: str) -> bool:
        return self.method in ("*", method.upper()) and fnmatchcase(url, self.url)

    def next_answer(self) -> Answer:
        answer = self.answers[min(self.used, len(self.answers) - 1)]
        self.used += 1
        return answer


@dataclass
class Case:
    """One fixture: what an offline run is given and what it must show."""

    name: str
    input: Any
    targets: list[Target]
    resumes: dict[str, Any]
    secrets: dict[str, str]
    expect: dict[str, Any]
    execution_id: str
    now: str
    public_url: str | None = None  # where {{ waits.STEP.url }} points (FLOWFORGE_PUBLIC_URL)

    def answer(self, method: str, url: str) -> Answer | None:
        """The next answer of the first target that matches, or None (no target does)."""
        for target in self.targets:
            if target.matches(method, url):
                return target.next_answer()
        return None


class _Reader:
    """Collects every problem of a fixture document, with its path."""

    def __init__(self) -> None:
        self.errors: list[dict[str, str]] = []

    def problem(self, path: str, message: str) -> None:
        self.errors.append({"path": path, "message": message})

    def obj(self, value: Any, path: str, keys: frozenset[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.problem(path, "must be an object")
            return {}
        for key in sorted(set(value) - keys):
            self.problem(f"{path}.{key}", f"unknown field (one of: {', '.join(sorted(keys))})")
        return value

    def answer(self, raw: Any, path: str) -> Answer:
        if raw == LOST:
            return Answer(lost=True)
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = {"status": raw}
        value = self.obj(raw, path, _ANSWER_KEYS)
        status = value.get("status", 200)
        if not isinstance(status, int) or not 100 <= status <= 599:
            self.problem(f"{path}.status", "must be an HTTP status, 100-599")
            status = 200
        delay = value.get("delay_s", 0)
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
            self.problem(f"{path}.delay_s", "must be a number of seconds, at least 0")
            delay = 0
        headers = {str(k).lower(): str(v) for k, v in dict(value.get("headers") or {}).items()}
        body = b""
        if "json" in value and "body" in value:
            self.problem(path, "json and body exclude each other")
        elif "json" in value:
            body = json.dumps(value["json"]).encode()
            headers.setdefault("content-type", "application/json")
        elif "body" in value:
            if not isinstance(value["body"], str):
                self.problem(f"{path}.body", "must be text (use json for a JSON value)")
            else:
                body = value["body"].encode()
        return Answer(status, headers, body, float(delay), bool(value.get("lost", False)))

    def target(self, raw: Any, path: str) -> Target:
        value = self.obj(raw, path, _TARGET_KEYS)
        method, url = value.get("method", "*"), value.get("url")
        if not isinstance(method, str):
            self.problem(f"{path}.method", "must be an HTTP method or *")
            method = "*"
        if not isinstance(url, str) or not url:
            self.problem(f"{path}.url", "must be a URL pattern (* matches any text)")
            url = ""
        answers = value.get("answers", [{}])
        if not isinstance(answers, list) or not answers:
            self.problem(f"{path}.answers", "must be a non-empty array")
            answers = [{}]
        parsed = [self.answer(a, f"{path}.answers[{i}]") for i, a in enumerate(answers)]
        return Target(method.upper(), url, parsed)

    def case(self, raw: Any, path: str, default_name: str) -> Case:
        value = self.obj(raw, path, _CASE_KEYS)
        targets = value.get("targets", [])
        if not isinstance(targets, list):
            self.problem(f"{path}.targets", "must be an array")
            targets = []
        expect = self.obj(value.get("expect", {}), f"{path}.expect", _EXPECT_KEYS)
        if not isinstance(expect.get("steps", {}), dict):
            self.problem(f"{path}.expect.steps", "must be an object: step id -> expectation")
        if not isinstance(expect.get("requests", []), list):
            self.problem(f"{path}.expect.requests", "must be an array, in the order sent")
        for name in ("resumes", "secrets"):
            if not isinstance(value.get(name, {}), dict):
                self.problem(f"{path}.{name}", "must be an object")
        secrets = value.get("secrets", {}) if isinstance(value.get("secrets"), dict) else {}
        if not all(isinstance(v, str) for v in secrets.values()):
            self.problem(
                f"{path}.secrets", "each value must be text (a test value, never a real one)"
            )
        return Case(
            name=str(value.get("name", default_name)),
            input=value.get("input", {}),
            targets=[self.target(t, f"{path}.targets[{i}]") for i, t in enumerate(targets)],
            resumes=dict(value.get("resumes", {}) or {}),
            secrets={str(k): str(v) for k, v in secrets.items()},
            expect=expect,
            execution_id=str(value.get("execution_id", "00000000-0000-7000-8000-000000000001")),
            now=str(value.get("now", DEFAULT_NOW)),
            public_url=str(value["public_url"]) if "public_url" in value else None,
        )


def parse_cases(document: Any, name: str = "case") -> list[Case]:
    """The cases of a fixture document: one case, or `{"cases": [...]}`."""
    reader = _Reader()
    if isinstance(document, dict) and "cases" in document:
        raw = document["cases"]
        if set(document) != {"cases"}:
            reader.problem("$", "a document with cases has no other field")
        if not isinstance(raw, list) or not raw:
            reader.problem("$.cases", "must be a non-empty array")
            raw = []
        cases = [reader.case(c, f"$.cases[{i}]", f"{name}[{i}]") for i, c in enumerate(raw)]
    else:
        cases = [reader.case(document, "$", name)]
    if reader.errors:
        raise FixtureInvalid(reader.errors)
    return cases


def read_cases(path: Path) -> list[Case]:
    """The cases of a fixture file, named after it unless they name themselves."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FixtureInvalid([{"path": "$", "message": f"cannot read {path}: {exc}"}]) from None
    return parse_cases(document, path.stem)


def differences(expect: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Where an offline run's result (offline.Result.as_dict) differs from a case's
    expectations; empty when it shows them all. An object expected matches an object that
    holds at least its fields (so an expected output names only what matters); arrays and
    everything else match exactly."""
    found: list[str] = []
    if "status" in expect and expect["status"] != actual["status"]:
        found.append(f"status: expected {expect['status']!r}, got {actual['status']!r}")
    for sid, wanted in expect.get("steps", {}).items():
        step = actual["steps"].get(sid)
        if step is None:
            found.append(f"steps.{sid}: no such step")
            continue
        if isinstance(wanted, str):
            wanted = {"status": wanted}
        _compare(wanted, step, f"steps.{sid}", found)
    if "requests" in expect:
        wanted_requests, sent = expect["requests"], actual["requests"]
        if len(wanted_requests) != len(sent):
            found.append(
                f"requests: expected {len(wanted_requests)}, sent {len(sent)}: "
                + ", ".join(f"{r['step']} {r['method']} {r['url']}" for r in sent)
            )
        for index, (wanted, request) in enumerate(zip(wanted_requests, sent, strict=False)):
            request = {**request, "headers": {k.lower(): v for k, v in request["headers"].items()}}
            if isinstance(wanted, dict) and isinstance(wanted.get("headers"), dict):
                wanted = {**wanted, "headers": {k.lower(): v for k, v in wanted["headers"].items()}}
            _compare(wanted, request, f"requests[{index}]", found)
    return found


def _compare(wanted: Any, got: Any, path: str, found: list[str]) -> None:
    if isinstance(wanted, dict) and isinstance(got, dict):
        for key, value in wanted.items():
            if key not in got:
                found.append(f"{path}.{key}: expected {_short(value)}, absent")
            else:
                _compare(value, got[key], f"{path}.{key}", found)
    elif isinstance(wanted, list) and isinstance(got, list) and len(wanted) == len(got):
        for index, (w, g) in enumerate(zip(wanted, got, strict=True)):
            _compare(w, g, f"{path}[{index}]", found)
    elif wanted != got or (type(wanted) is not type(got) and not _same_number(wanted, got)):
        found.append(f"{path}: expected {_short(wanted)}, got {_short(got)}")


def _same_number(a: Any, b: Any) -> bool:
    numbers = (int, float)
    return (
        isinstance(a, numbers)
        and isinstance(b, numbers)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and a == b
    )


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 200 else text[:197] + "..."
