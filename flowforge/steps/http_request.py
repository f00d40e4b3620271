"""The http_request step: render the request, send it through the SSRF guard, and say
what happened in the terms of SPEC §7 — succeeded, retry, failed, or unknown.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

from flowforge import netguard
from flowforge.db import jsonb_storable
from flowforge.definitions import Step
from flowforge.templating import (
    TemplateError,
    find_placeholders,
    iter_template_strings,
    render,
    render_url,
)

RETRYABLE_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
# Response headers worth keeping in the step output; the rest are noise or private.
KEPT_HEADERS = ("content-type", "content-length", "location", "etag", "retry-after", "x-request-id")
REDACTED = "[redacted]"


@dataclass(frozen=True)
class Outcome:
    """The verdict on one attempt."""

    kind: str  # succeeded | retry | failed | unknown
    output: Any = None
    error: str | None = None
    http_status: int | None = None
    duration_ms: int | None = None
    retry_after_s: float | None = None

    @property
    def attempt_outcome(self) -> str:
        """The attempt row's outcome: a retry is a failed attempt."""
        return "failed" if self.kind == "retry" else self.kind


@dataclass(frozen=True)
class Rendered:
    """A request ready to leave, and the secret values that must never be stored."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None
    timeout_s: float
    secret_values: tuple[str, ...]


class SecretMissing(TemplateError):
    """A template names a secret the worker was not given."""


def read_secret(name: str, env: Mapping[str, str] | None = None) -> str:
    """A secret from FLOWFORGE_SECRET_<NAME> or systemd's $CREDENTIALS_DIRECTORY/<name>."""
    env = os.environ if env is None else env
    value = env.get(f"FLOWFORGE_SECRET_{name.upper()}")
    if value is not None:
        return value
    directory = env.get("CREDENTIALS_DIRECTORY")
    if directory:
        path = Path(directory) / name
        if path.is_file():
            return path.read_text(encoding="utf-8").rstrip("\n")
    raise SecretMissing(
        f"secret {name!r} is not configured (set FLOWFORGE_SECRET_{name.upper()} "
        "or a systemd credential)"
    )


def _secrets_used(request: Mapping[str, Any]) -> dict[str, str]:
    names = {
        path.split(".")[1]
        for _, text in iter_template_strings(request)
        for path in find_placeholders(text)
        if path.startswith("secrets.") and path.count(".") >= 1
    }
    return {name: read_secret(name) for name in sorted(names)}


def render_request(step: Step, context: Mapping[str, Any]) -> Rendered:
    """Resolve templates in the worker only; secrets never leave this object."""
    assert step.request is not None
    request = step.request
    secrets = _secrets_used(request)
    ctx = {**context, "secrets": secrets}
    headers = {
        name: _header_text(name, render(value, ctx)) for name, value in request["headers"].items()
    }
    body: bytes | None = None
    if "json" in request:
        body = json.dumps(render(request["json"], ctx), separators=(",", ":")).encode()
        headers.setdefault("Content-Type", "application/json")
    elif "body" in request:
        body = _header_text("body", render(request["body"], ctx)).encode()
    if request["idempotency_key"] is not None:
        headers["Idempotency-Key"] = _header_text(
            "idempotency_key", render(request["idempotency_key"], ctx)
        )
    return Rendered(
        method=request["method"],
        url=render_url(request["url"], ctx),
        headers=headers,
        body=body,
        timeout_s=float(request["timeout_s"]),
        secret_values=_spellings(v for v in secrets.values() if v),
    )


def _spellings(values: Iterable[str]) -> tuple[str, ...]:
    """Every form a server may echo a secret back in: as sent, %-encoded (as URLs carry it),
    JSON-escaped ('/' as '\\/' too); longest first so no shorter form splits a longer one."""
    forms: set[str] = set()
    for value in values:
        encoded = {value, quote(value, safe=""), quote_plus(value, safe="")}
        for form in encoded:
            for escaped in (json.dumps(form)[1:-1], json.dumps(form, ensure_ascii=False)[1:-1]):
                forms |= {form, escaped, escaped.replace("/", "\\/")}
    return tuple(sorted(forms, key=len, reverse=True))


def _header_text(name: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None or isinstance(value, dict | list):
        raise TemplateError(f"{name} must render to a string or number")
    return str(value)


def perform(
    step: Step,
    rendered: Rendered,
    allow: netguard.Allowlist,
    max_response_bytes: int,
    before_send: Callable[[], None] | None = None,
) -> Outcome:
    """Send the request once and classify the result by what is known to have happened.

    `before_send` runs once connected, right before the first byte is written; raising
    `netguard.NotSent` from it keeps the request home (an outcome safe to retry).
    """
    safe = step.repeat_safe
    try:
        result = netguard.send(
            rendered.method,
            rendered.url,
            headers=rendered.headers,
            body=rendered.body,
            timeout_s=rendered.timeout_s,
            allow=allow,
            max_response_bytes=max_response_bytes,
            before_send=before_send,
        )
    except (netguard.RequestRefused, netguard.RequestInvalid) as exc:
        # Deterministic: the same rendered request would be refused again.
        return Outcome("failed", error=_redact(str(exc), rendered.secret_values))
    except netguard.NotSent as exc:
        # Provably never left: repeating is safe whatever the method.
        return Outcome("retry", error=_redact(f"not sent: {exc}", rendered.secret_values))
    except netguard.SentNoResponse as exc:
        error = _redact(f"no response: {exc}", rendered.secret_values)
        return Outcome("retry" if safe else "unknown", error=error)
    output = _output(result, rendered.secret_values)
    if 200 <= result.status < 300:
        return Outcome(
            "succeeded", output=output, http_status=result.status, duration_ms=result.duration_ms
        )
    error = f"HTTP {result.status} from {rendered.method} request"
    kind = "retry" if safe and result.status in RETRYABLE_STATUS else "failed"
    return Outcome(
        kind,
        output=output,
        error=error,
        http_status=result.status,
        duration_ms=result.duration_ms,
        retry_after_s=result.retry_after_s,
    )


def _output(result: netguard.HttpResult, secret_values: tuple[str, ...]) -> dict[str, Any]:
    # NUL cannot be stored in PostgreSQL text: a server sending one must not block the checkpoint.
    text = _redact(result.body.decode("utf-8", errors="replace"), secret_values)
    text = text.replace("\x00", "\ufffd")
    body: Any = text
    if "json" in result.headers.get("content-type", "") and not result.truncated:
        body = _parsed(text, secret_values)
    headers = {
        name: _redact(result.headers[name], secret_values).replace("\x00", "\ufffd")
        for name in KEPT_HEADERS
        if name in result.headers
    }
    return {
        "status": result.status,
        "headers": headers,
        "body": body,
        "truncated": result.truncated,
    }


def _parsed(text: str, secret_values: tuple[str, ...]) -> Any:
    """The JSON body, redacted again after decoding (escapes such as \\u0074 hide a secret
    from the text); JSON that jsonb cannot hold (\\u0000, lone surrogates, 1e999, deep
    nesting) stays text, so a hostile server cannot make the checkpoint fail."""
    try:
        value = _redact_json(json.loads(text), secret_values)
    except (ValueError, RecursionError):
        return text
    return value if jsonb_storable(value) else text


def _redact_json(value: Any, secret_values: tuple[str, ...]) -> Any:
    """Redact every string in a parsed JSON value, keys included."""
    if not secret_values:
        return value
    if isinstance(value, str):
        return _redact(value, secret_values)
    if isinstance(value, dict):
        return {
            _redact(key, secret_values): _redact_json(item, secret_values)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_redact_json(item, secret_values) for item in value]
    return value


def _redact(text: str, secret_values: tuple[str, ...]) -> str:
    """Remove secret values a server echoed back before anything is stored or logged."""
    for value in secret_values:
        text = text.replace(value, REDACTED)
    return text
