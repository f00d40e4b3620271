"""The http_request step: render the request, send it through the SSRF guard, and say
what happened in the terms of SPEC §7 — succeeded, retry, failed, or unknown.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowforge import netguard, secret_bindings, waits
from flowforge.definitions import Step
from flowforge.jsonvalues import jsonb_storable
from flowforge.model import Outcome
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
# How much body an attempt's own record keeps of what it sent and what came back
# (attempts.request / attempts.response): enough for an operator to see what happened;
# the step's output keeps the last response up to the worker's full limit.
ATTEMPT_BODY_BYTES = 4096
# What jsonb cannot hold in a string; replaced so recording an attempt never fails.
_NOT_STORABLE = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True)
class Rendered:
    """A request ready to leave, and how to find the secrets in it that must never be stored."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None
    timeout_s: float
    redactor: re.Pattern[str] | None  # matches every spelling of every secret used
    redactor_reach: int  # the most bytes one match of it may span
    url_holds_secret: bool  # then no error message may name the URL's scheme or host

    def redact(self, text: str) -> str:
        """The text without any spelling of the secrets this request uses."""
        return _redact(text, self.redactor)

    def record(self) -> dict[str, Any]:
        """The request as it leaves, for its attempt's row (written with the claim, before
        the first byte): redacted as a step output is, its body cut at ATTEMPT_BODY_BYTES."""
        body, truncated = None, False
        if self.body is not None:
            body, truncated = _preview(self.body, self.redactor, self.redactor_reach)
        return {
            "method": self.method,
            "url": _storable(self.redact(self.url)),
            "headers": {
                name: _storable(self.redact(value)) for name, value in self.headers.items()
            },
            "body": body,
            "truncated": truncated,
        }


class SecretMissing(TemplateError):
    """A template names a secret the worker was not given."""


class SecretNotBound(TemplateError):
    """A template names a secret that its workflow may not use."""


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


def _secrets_used(
    request: Mapping[str, Any], workflow: str, bindings: secret_bindings.Bindings
) -> dict[str, str]:
    """The values of the secrets a request names, each only if its workflow may use it."""
    names = {
        path.split(".")[1]
        for _, text in iter_template_strings(request)
        for path in find_placeholders(text)
        if path.startswith("secrets.") and path.count(".") >= 1
    }
    for name in sorted(names):
        if not secret_bindings.may_use(bindings, name, workflow):
            raise SecretNotBound(
                f"secret {name!r} is not bound to workflow {workflow!r}: list the workflow "
                f"in {secret_bindings.variable(name)} to let it use the secret"
            )
    return {name: read_secret(name) for name in sorted(names)}


def _resume_urls(
    request: Mapping[str, Any], execution_id: str, resume: waits.ResumeUrls | None
) -> dict[str, dict[str, str]]:
    """The resume URLs a request names ({{ waits.STEP.url }}), as template context."""
    names = {
        path.split(".")[1]
        for _, text in iter_template_strings(request)
        for path in find_placeholders(text)
        if path.startswith("waits.") and path.count(".") == 2
    }
    if not names:
        return {}
    resume = resume or waits.ResumeUrls(public_url=None, key=None)  # fails, saying what
    return {name: {"url": resume.url(execution_id, name)} for name in sorted(names)}


def render_request(
    step: Step,
    context: Mapping[str, Any],
    bindings: secret_bindings.Bindings,
    resume: waits.ResumeUrls | None = None,
) -> Rendered:
    """Resolve templates in the worker only; secrets and resume URLs never leave this
    object, and only the secrets bound to the execution's workflow are read at all."""
    assert step.request is not None
    request = step.request
    secrets = _secrets_used(request, context["execution"]["workflow"], bindings)
    urls = _resume_urls(request, context["execution"]["id"], resume)
    ctx = {**context, "secrets": secrets, "waits": urls}
    # A resume URL is a credential: its token is redacted like a secret wherever a
    # server echoes it back.
    credentials = [*secrets.values(), *(u["url"].rsplit("/", 1)[1] for u in urls.values())]
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
        redactor=redactor(credentials),
        redactor_reach=redactor_reach(credentials),
        url_holds_secret=any(
            path.startswith(("secrets.", "waits.")) for path in find_placeholders(request["url"])
        ),
    )


# JSON's two-character escapes, by the character they stand for; the backslash's own
# is spelled by _backslashes_pattern.
_SHORT_ESCAPES = {
    '"': '"',
    "/": "/",
    "\b": "b",
    "\f": "f",
    "\n": "n",
    "\r": "r",
    "\t": "t",
}


# A JSON escape nested in JSON strings d levels deep sits behind 2**(d-1) backslashes; 16
# covers five levels. A bounded run is what keeps matching linear: an unbounded one, tried
# at every start inside a long run of backslashes, scanned the rest of the run each time.
# A longer run still matches, starting later in it: only the extra backslashes stay.
_RUN = r"\\{1,16}"


def _char_pattern(char: str) -> str:
    """Every way one character of a secret may come back: as itself in any letter case,
    JSON-escaped (\\uXXXX or \\n style, behind up to 16 backslashes, as JSON inside a JSON
    string doubles them), %-encoded UTF-8 in either hex case, '+' for a space."""
    alternatives = []  # the longest spellings first
    code = ord(char)
    if code > 0xFFFF:
        high, low = divmod(code - 0x10000, 0x400)
        alternatives.append(rf"{_RUN}u{0xD800 + high:04x}{_RUN}u{0xDC00 + low:04x}")
    else:
        alternatives.append(rf"{_RUN}u{code:04x}")
    if char in _SHORT_ESCAPES:
        alternatives.append(_RUN + re.escape(_SHORT_ESCAPES[char]))
    alternatives.append("".join(rf"(?:%|{_RUN}u0025){byte:02x}" for byte in char.encode()))
    if char == " ":
        alternatives.append(r"\+")
    alternatives.append(re.escape(char))
    return "(?:" + "|".join(alternatives) + ")"


def _backslashes_pattern(count: int) -> str:
    """A run of `count` backslashes in a secret, spelled as one: char by char, the run's
    raw and escaped forms (1 to 17 backslashes each) could split a long run of backslashes
    in a body so many ways that trying them all takes exponential time."""
    alternatives = (
        rf"(?:{_RUN}u005c){{{count}}}",
        rf"(?:(?:%|{_RUN}u0025)5c){{{count}}}",
        rf"\\{{{count},{17 * count}}}",
    )
    return "(?:" + "|".join(alternatives) + ")"


def _secret_pattern(value: str) -> str:
    """The pattern for one spelling of a secret: character by character, except that each
    run of backslashes is one piece. One that starts with a backslash starts only where a
    run of them does: tried inside a run, its first piece would take up to 17 backslashes
    per secret backslash and then try every shorter split, at every position."""
    pieces = [r"(?<!\\)"] if value.startswith("\\") else []
    for char, run in itertools.groupby(value):
        count = len(list(run))
        if char == "\\":
            pieces.append(_backslashes_pattern(count))
        else:
            pieces.extend([_char_pattern(char)] * count)
    return "".join(pieces)


def redactor(values: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern for all secrets, longest first so no shorter one splits a longer one.
    Upper and lower case are spelled out too: full case mapping is not one character to
    one ('ß'.upper() is 'SS'), which IGNORECASE alone would miss."""
    spelled: dict[str, str] = {}  # spelling -> its pattern
    for value in filter(None, values):
        pattern = _secret_pattern(value)
        spelled[value] = pattern
        for other in (value.upper(), value.lower(), value.casefold()):
            if other not in spelled and not re.fullmatch(pattern, other, re.IGNORECASE):
                spelled[other] = _secret_pattern(other)
    if not spelled:
        return None
    longest_first = sorted(spelled, key=len, reverse=True)
    return re.compile("|".join(spelled[form] for form in longest_first), re.IGNORECASE)


# The longest spelling of one character: each of its (up to 4) UTF-8 bytes %-encoded with
# the '%' JSON-escaped behind 16 backslashes, 23 bytes apiece.
_LONGEST_CHAR_SPELLING = 4 * (16 + len("u0025") + 2)


def redactor_reach(values: Iterable[str]) -> int:
    """The most bytes one match of `redactor(values)` may span; a response is read this far
    past its size limit, so a secret straddling the cut is still redacted whole."""
    forms = [
        form for value in values for form in (value, value.upper(), value.lower(), value.casefold())
    ]
    return _LONGEST_CHAR_SPELLING * max(map(len, forms), default=0)


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
            max_response_bytes=max_response_bytes + rendered.redactor_reach,
            reveal_origin=not rendered.url_holds_secret,
            before_send=before_send,
        )
    except (netguard.RequestRefused, netguard.RequestInvalid) as exc:
        # Deterministic: the same rendered request would be refused again.
        return Outcome("failed", error=_redact(str(exc), rendered.redactor))
    except netguard.NotSent as exc:
        # Provably never left: repeating is safe whatever the method.
        return Outcome("retry", error=_redact(f"not sent: {exc}", rendered.redactor))
    except netguard.SentNoResponse as exc:
        error = _redact(f"no response: {exc}", rendered.redactor)
        return Outcome("retry" if safe else "unknown", error=error)
    output = _output(result, rendered.redactor, max_response_bytes)
    body, truncated = _preview(result.body, rendered.redactor, rendered.redactor_reach)
    response = {
        "status": result.status,
        "headers": output["headers"],
        "body": body,
        "truncated": truncated or result.truncated,
    }
    if 200 <= result.status < 300:
        return Outcome(
            "succeeded",
            output=output,
            http_status=result.status,
            duration_ms=result.duration_ms,
            response=response,
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
        response=response,
    )


def _output(
    result: netguard.HttpResult, secrets: re.Pattern[str] | None, max_response_bytes: int
) -> dict[str, Any]:
    truncated = result.truncated or len(result.body) > max_response_bytes
    text = result.body.decode("utf-8", errors="replace")
    if truncated:
        # Redacted before the cut, never after: a secret the cut went through would be
        # stored minus only its last characters.
        kept = len(result.body[:max_response_bytes].decode("utf-8", errors="replace"))
        text = _redact_prefix(text, secrets, kept)
    else:
        text = _redact(text, secrets)
    # NUL cannot be stored in PostgreSQL text: a server sending one must not block the checkpoint.
    text = text.replace("\x00", "\ufffd")
    body: Any = text
    if "json" in result.headers.get("content-type", "") and not truncated:
        body = _parsed(text, secrets)
    headers = {
        name: _redact(result.headers[name], secrets).replace("\x00", "\ufffd")
        for name in KEPT_HEADERS
        if name in result.headers
    }
    return {
        "status": result.status,
        "headers": headers,
        "body": body,
        "truncated": truncated,
    }


def _preview(data: bytes, secrets: re.Pattern[str] | None, reach: int) -> tuple[str, bool]:
    """A body cut at ATTEMPT_BODY_BYTES as text, and whether it was cut: redacted before the
    cut like a truncated step output, reading only as far past it as one secret reaches."""
    truncated = len(data) > ATTEMPT_BODY_BYTES
    if not truncated:
        return _storable(_redact(data.decode("utf-8", errors="replace"), secrets)), False
    kept = len(data[:ATTEMPT_BODY_BYTES].decode("utf-8", errors="replace"))
    text = data[: ATTEMPT_BODY_BYTES + reach].decode("utf-8", errors="replace")
    return _storable(_redact_prefix(text, secrets, kept)), True


def _storable(text: str) -> str:
    return _NOT_STORABLE.sub("\ufffd", text)


def _parsed(text: str, secrets: re.Pattern[str] | None) -> Any:
    """The JSON body, redacted again after decoding (escapes such as \\u0074 hide a secret
    from the text); JSON that jsonb cannot hold (\\u0000, lone surrogates, 1e999) or that
    nests beyond MAX_DEPTH stays text, so a hostile server can neither make the checkpoint
    fail nor store a value that fails to load later. Judged before the (recursive)
    redaction, which then never meets a value deeper than the limit."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return _redact_json(value, secrets) if jsonb_storable(value) else text


def _redact_json(value: Any, secrets: re.Pattern[str] | None) -> Any:
    """Redact every string in a parsed JSON value, keys included."""
    if secrets is None:
        return value
    if isinstance(value, str):
        return _redact(value, secrets)
    if isinstance(value, dict):
        return {_redact(key, secrets): _redact_json(item, secrets) for key, item in value.items()}
    if isinstance(value, list):
        return [_redact_json(item, secrets) for item in value]
    return value


def _redact_prefix(text: str, secrets: re.Pattern[str] | None, length: int) -> str:
    """The first `length` characters of the text, redacted; a secret that starts among them
    is redacted whole. Cut in the text's own positions, as replacements shorter than the
    secret would otherwise pull in the start of one the read limit went through."""
    if secrets is None:
        return text[:length]
    pieces = []
    end = 0
    for match in secrets.finditer(text):
        if match.start() >= length:
            break
        pieces += [text[end : match.start()], REDACTED]
        end = match.end()
    pieces.append(text[end:length])
    return "".join(pieces)


def _redact(text: str, secrets: re.Pattern[str] | None) -> str:
    """Remove secret values a server echoed back before anything is stored or logged."""
    return text if secrets is None else secrets.sub(REDACTED, text)
