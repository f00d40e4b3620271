"""A production execution as a `flowforge test` fixture (`flowforge executions export`,
docs/reference/testing.md): its input, each attempt's request and answer as stored, the
resumes its waits took, and what it ended with as the expectation — so that
`flowforge test --from FILE` replays it offline on the same or a newer definition and says
where the outcomes differ.

Never a secret: the attempts were stored redacted (http_step.Rendered.record), the
secrets a definition names are exported by name with a test value, every value of a
secret the exporting process knows is cut out of the whole document in every spelling the
worker's redactor finds, and resume tokens are removed (a resume URL is a credential).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from flowforge.domain.templating import find_placeholders, iter_template_strings
from flowforge.steps.fixtures import LOST
from flowforge.steps.http_step import REDACTED, redactor
from flowforge.trust.resume_tokens import RESUME_PATH

# A resume token as the API's resume path carries it: whatever follows the path.
_RESUME_TOKEN = re.compile(re.escape(RESUME_PATH) + r"(?!\[)[^\s\"'\\/?#&<>]+")
# Where the resume URLs the execution sent pointed (FLOWFORGE_PUBLIC_URL), so that the
# offline run renders the same URLs (their tokens redacted alike).
_PUBLIC_URL = re.compile(r"(https?://[^\s\"'\\]+?)" + re.escape(RESUME_PATH))
REMOVED_TOKEN = RESUME_PATH + "[resume token removed]"
# The events of a wait that ended with a body (Run.resume): its output is the resume.
RESUMED = frozenset({"wait.resumed", "wait.completed"})


def secret_names(definition: Any) -> list[str]:
    """The secrets a definition names (`{{ secrets.NAME }}`), for the fixture's test values."""
    return sorted(
        {
            path.split(".")[1]
            for _, text in iter_template_strings(definition)
            for path in find_placeholders(text)
            if path.startswith("secrets.") and path.count(".") >= 1
        }
    )


def _answer(attempt: dict[str, Any]) -> Any:
    """An attempt's stored answer as a fixture answer; `lost` when none came back."""
    response = attempt.get("response")
    if not isinstance(response, dict):
        return LOST
    headers = {str(k): str(v) for k, v in (response.get("headers") or {}).items()}
    answer: dict[str, Any] = {"status": response.get("status", 200), "headers": headers}
    body = response.get("body")
    if isinstance(body, str) and body:
        answer["body"] = body
    return answer


def _attempts(execution: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every attempt that sent a request, in the order they started."""
    found = [
        (step["id"], attempt)
        for step in execution["steps"]
        for attempt in step.get("attempts", [])
        if attempt.get("request")
    ]
    return sorted(found, key=lambda pair: (pair[1].get("started_at") or "", pair[1]["attempt"]))


def as_fixture(execution: dict[str, Any], definition: Any) -> dict[str, Any]:
    """The fixture of one execution document (GET /api/v1/executions/{id})."""
    targets: dict[tuple[str, str], dict[str, Any]] = {}
    requests = []
    for step_id, attempt in _attempts(execution):
        request = attempt["request"]
        target = targets.setdefault(
            (request["method"], request["url"]),
            {"method": request["method"], "url": request["url"], "answers": []},
        )
        target["answers"].append(_answer(attempt))
        requests.append(
            {
                "step": step_id,
                "method": request["method"],
                "url": request["url"],
                "headers": request.get("headers") or {},
                "body": request.get("body"),
            }
        )
    public = _PUBLIC_URL.search(json.dumps(requests))
    resumed = {e["step"] for e in execution.get("events", []) if e.get("kind") in RESUMED}
    return {
        "name": f"execution {execution['id']} of {execution['workflow']} "
        f"version {execution['version']}",
        "execution_id": execution["id"],
        "now": execution["created_at"],
        "input": execution["input"],
        **({"public_url": public.group(1)} if public else {}),
        "secrets": {name: f"test-value-of-{name}" for name in secret_names(definition)},
        "resumes": {
            s["id"]: s["output"]
            for s in execution["steps"]
            if s["type"] == "wait" and s["id"] in resumed
        },
        "targets": list(targets.values()),
        "expect": {
            "status": execution["status"],
            "steps": {
                s["id"]: {"status": s["status"], "output": s["output"]} for s in execution["steps"]
            },
            "requests": requests,
        },
    }


def scrubbed(fixture: dict[str, Any], secrets: Iterable[str]) -> str:
    """The fixture as JSON text with no resume token and no spelling of any of `secrets`."""
    text = json.dumps(fixture, indent=2, ensure_ascii=False)
    text = _RESUME_TOKEN.sub(REMOVED_TOKEN, text)
    found = redactor([s for s in secrets if s])
    if found is not None:
        # Cut out of each string value and put back as JSON, so the document stays valid.
        text = json.dumps(_redacted(json.loads(text), found), indent=2, ensure_ascii=False)
        if found.reveals(text):  # a spelling that spans the JSON escaping itself
            raise ValueError("the export still spells a secret; nothing written")
    return text + "\n"


def _redacted(value: Any, found: Any) -> Any:
    if isinstance(value, str):
        return found.sub(REDACTED, value)
    if isinstance(value, list):
        return [_redacted(v, found) for v in value]
    if isinstance(value, dict):
        return {_redacted(k, found): _redacted(v, found) for k, v in value.items()}
    return value
