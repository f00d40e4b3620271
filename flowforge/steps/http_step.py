"""The http_request step: render the request, send it through the SSRF guard, and say
what happened in the terms of docs/contract.md#delivery-unknown — succeeded, retry, failed, or
unknown.
"""

from __future__ import annotations

import codecs
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from html.entities import html5
from pathlib import Path
from typing import Any

from flowforge.domain.definitions import Step
from flowforge.domain.jsonvalues import jsonb_storable
from flowforge.domain.model import Outcome, OutcomeKind
from flowforge.domain.templating import (
    TemplateError,
    find_placeholders,
    iter_template_strings,
    render,
    render_url,
)
from flowforge.steps import netguard
from flowforge.trust import resume_tokens, secret_bindings

RETRYABLE_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
# Response headers worth keeping in the step output; the rest are noise or private.
KEPT_HEADERS = ("content-type", "content-length", "location", "etag", "retry-after", "x-request-id")
REDACTED = "[redacted]"
# What is stored of a text that still decodes to a secret once every spelling the
# redactor knows was cut out (Redactor.clean).
WITHHELD = "[withheld: it echoed a secret in an encoding that cannot be cut out]"
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
    redactor: Redactor | None  # matches every spelling of every secret used
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
    request: Mapping[str, Any],
    workflow: str,
    bindings: secret_bindings.Bindings,
    env: Mapping[str, str] | None = None,
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
    return {name: read_secret(name, env) for name in sorted(names)}


def _resume_urls(
    request: Mapping[str, Any],
    execution_id: str,
    resume: resume_tokens.ResumeUrls | None,
    rounds: Mapping[str, int],
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
    resume = resume or resume_tokens.ResumeUrls(public_url=None, key=None)  # fails, saying what
    return {
        name: {"url": resume.url(execution_id, name, rounds.get(name, 0))} for name in sorted(names)
    }


def render_request(
    step: Step,
    context: Mapping[str, Any],
    bindings: secret_bindings.Bindings,
    resume: resume_tokens.ResumeUrls | None = None,
    rounds: Mapping[str, int] | None = None,
    env: Mapping[str, str] | None = None,
) -> Rendered:
    """Resolve templates in the worker only; secrets and resume URLs never leave this
    object, and only the secrets bound to the execution's workflow are read at all.

    `rounds` gives each wait step's round (its fencing token, bumped by a retry), so a
    retried wait is rendered under a new resume URL (flowforge/trust/resume_tokens.py). `env`: where
    secrets are read (read_secret; `flowforge test` passes a fixture's test values)."""
    assert step.request is not None
    request = step.request
    secrets = _secrets_used(request, context["execution"]["workflow"], bindings, env)
    urls = _resume_urls(request, context["execution"]["id"], resume, rounds or {})
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
# How many times over a server may have %-encoded or HTML-escaped what it echoes: a
# sign-in redirect's `?next=` of a URL that held the secret already is two; a bound keeps
# each match short (redactor_reach) and the pattern linear.
NESTING = 4
# A '%' as it reaches us: itself, JSON-escaped, then %-encoded again up to NESTING times
# (`%2541` is `%41` is `A`).
_PERCENT = rf"(?:%|{_RUN}u0025)(?:25){{0,{NESTING}}}"
# Named entities of the characters HTML and XML escape (html.escape, XML's five).
_NAMED_ENTITIES = {"&": "amp", "<": "lt", ">": "gt", '"': "quot", "'": "apos"}


def _plain(char: str) -> str:
    """An ASCII character of the entity or escape syntax itself: as is, %-encoded (any
    depth) or JSON-escaped (as Go's encoder writes `&`, `<` and `>`)."""
    return rf"(?:{re.escape(char)}|{_PERCENT}{ord(char):02x}|{_RUN}u{ord(char):04x})"


# An entity's opening '&', itself escaped up to NESTING times more (`&amp;lt;`).
_AMPERSAND = rf"{_plain('&')}(?:amp{_plain(';')}){{0,{NESTING}}}"


def _entity(code: int) -> str:
    """The HTML/XML character references of one code point: decimal, hex (any case, up to
    eight leading zeros) and the named one where there is one; the ';' may be missing, as
    HTML parsers accept."""
    hash_sign = _plain("#")
    names = [
        rf"{hash_sign}0{{0,8}}{code}",
        rf"{hash_sign}x0{{0,8}}{code:x}",
        *(name for char, name in _NAMED_ENTITIES.items() if ord(char) == code),
    ]
    return rf"{_AMPERSAND}(?:{'|'.join(names)}){_plain(';')}?"


_SINGLE_PERCENT = rf"(?:%|{_RUN}u0025)"


def _char_pattern(char: str, full: bool) -> str:
    """Every way one character of a secret may come back: as itself in any letter case,
    JSON-escaped (\\uXXXX or \\n style, behind up to 16 backslashes, as JSON inside a JSON
    string doubles them), %-encoded UTF-8 in either hex case, '+' for a space. `full`
    adds the spellings servers nest: %-encoding again up to NESTING times (and the '+'
    %-encoded), an HTML/XML character reference (decimal, hex or named, itself escaped
    again up to NESTING times)."""
    percent = _PERCENT if full else _SINGLE_PERCENT
    alternatives = [_entity(ord(char))] if full else []  # the longest spellings first
    code = ord(char)
    if code > 0xFFFF:
        high, low = divmod(code - 0x10000, 0x400)
        alternatives.append(rf"{_RUN}u{0xD800 + high:04x}{_RUN}u{0xDC00 + low:04x}")
    else:
        alternatives.append(rf"{_RUN}u{code:04x}")
    if char in _SHORT_ESCAPES:
        alternatives.append(_RUN + re.escape(_SHORT_ESCAPES[char]))
    alternatives.append("".join(rf"{percent}{byte:02x}" for byte in char.encode()))
    if char == " ":
        alternatives += [rf"{percent}2b", r"\+"] if full else [r"\+"]
    alternatives.append(re.escape(char))
    return "(?:" + "|".join(alternatives) + ")"


def _backslashes_pattern(count: int, full: bool) -> str:
    """A run of `count` backslashes in a secret, spelled as one: char by char, the run's
    raw and escaped forms (1 to 17 backslashes each) could split a long run of backslashes
    in a body so many ways that trying them all takes exponential time."""
    alternatives = [
        rf"(?:{_RUN}u005c){{{count}}}",
        rf"(?:{_PERCENT if full else _SINGLE_PERCENT}5c){{{count}}}",
        rf"\\{{{count},{17 * count}}}",
    ]
    if full:
        alternatives.insert(1, rf"(?:{_entity(0x5C)}){{{count}}}")
    return "(?:" + "|".join(alternatives) + ")"


def _secret_pattern(value: str, full: bool = False) -> str:
    """The pattern for one spelling of a secret: character by character, except that each
    run of backslashes is one piece. One that starts with a backslash starts only where a
    run of them does: tried inside a run, its first piece would take up to 17 backslashes
    per secret backslash and then try every shorter split, at every position."""
    pieces = [r"(?<!\\)"] if value.startswith("\\") else []
    for char, run in itertools.groupby(value):
        count = len(list(run))
        if char == "\\":
            pieces.append(_backslashes_pattern(count, full))
        else:
            pieces.extend([_char_pattern(char, full)] * count)
    return "".join(pieces)


class Redactor:
    """Finds every secret of a request in whatever a server echoed
    (docs/contract.md#secret-redaction).

    The spellings servers apply once (the secret in any case, JSON escapes, %-encoding,
    '+' for space) are cut by a pattern built with the redactor. The nested ones (%-encoding
    again, HTML/XML character references, escaped again) would make that pattern ten
    times larger, and most responses never echo a secret; so a cheap proof comes first:
    the text is decoded the ways servers encode (each decoder alone and all in turn, up to
    DECODE_ROUNDS levels) and case-folded, and only if a secret shows at some stage is
    the full pattern built (once per redactor) and applied. If what is left still decodes
    to a secret — a mixture no pattern spells — the whole text is withheld (WITHHELD):
    nothing stored is readable as a secret, whichever of these encodings a server used."""

    def __init__(self, values: Iterable[str]) -> None:
        self._values = tuple(dict.fromkeys(filter(None, values)))
        self._needles = tuple(
            {
                _folded(form)
                for value in self._values
                for form in (value, value.upper(), value.lower(), value.swapcase())
            }
        )
        self._patterns: dict[bool, re.Pattern[str]] = {}

    def pattern(self, full: bool = False) -> re.Pattern[str]:
        """One pattern for all secrets, longest first so no shorter one splits a longer
        one. Upper and lower case are spelled out too: full case mapping is not one
        character to one ('ß'.upper() is 'SS'), which IGNORECASE alone would miss."""
        if full not in self._patterns:
            spelled: dict[str, str] = {}  # spelling -> its pattern
            for value in self._values:
                pattern = _secret_pattern(value, full)
                spelled[value] = pattern
                for other in (value.upper(), value.lower(), value.casefold()):
                    if other not in spelled and not re.fullmatch(pattern, other, re.IGNORECASE):
                        spelled[other] = _secret_pattern(other, full)
            longest_first = sorted(spelled, key=len, reverse=True)
            self._patterns[full] = re.compile(
                "|".join(spelled[form] for form in longest_first), re.IGNORECASE
            )
        return self._patterns[full]

    def reveals(self, text: str) -> bool:
        """Whether the text, or any stage of decoding it every way a server may have
        encoded it, holds a secret. Every stage, not only the last: undoing one encoding
        can spoil a secret's plain neighbour (a backslash before a plain `tok` decodes
        to a tab and `ok`)."""
        return any(needle in stage for stage in _decoding_stages(text) for needle in self._needles)

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        """The spellings of the secrets in the text: the full pattern's when the text
        decodes to a secret, else the single-encoding pattern's."""
        return self.pattern(self.reveals(text)).finditer(text)

    def sub(self, replacement: str, text: str) -> str:
        """The text with every spelling of every secret replaced, or WITHHELD."""
        text = self.pattern().sub(replacement, text)
        if not self.reveals(text):
            return text
        return self.clean(self.pattern(full=True).sub(replacement, text))

    def clean(self, redacted: str) -> str:
        """What may be stored of a text already cut: it, or WITHHELD when it still
        decodes to a secret."""
        return WITHHELD if self.reveals(redacted) else redacted


def redactor(values: Iterable[str]) -> Redactor | None:
    """The redactor of these secrets; None when there are none."""
    found = Redactor(values)
    return found if found._values else None


# How many times over the decoders are applied: each round undoes one level of every
# encoding, so nestings and mixtures up to this depth are seen through (five levels of
# JSON in JSON, NESTING of %-encoding or HTML escaping).
DECODE_ROUNDS = 8
# In either case: the redactor promises upper-case spellings too (`\\U0074`, `\\N`).
_JSON_ESCAPE = re.compile(r"\\(?:u([0-9a-f]{4})|([\"\\/bfnrt]))", re.IGNORECASE)
_JSON_SHORT = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
# Named character references of ASCII characters (HTML5's `&sol;`, `&plus;` as much as
# XML's five); the cutting pattern spells only the five, so an echo in one of the others
# is withheld whole. html.unescape is not used: it drops or remaps the references of
# control characters (`&#x1f;`), which would spoil a secret holding one.
_ASCII_NAMES = {
    name.rstrip(";").lower(): char
    for name, char in html5.items()
    if len(char) == 1 and char < "\x80"
}
_REFERENCE = re.compile(
    r"&(?:#0*(\d{1,7})|#x0*([0-9a-f]{1,6})|(" + "|".join(sorted(_ASCII_NAMES)) + r"));?",
    re.IGNORECASE,
)
# Only these characters start an encoding the decoders undo.
_ENCODING_MARKS = re.compile(r"[%&\\]")


def _json_unescaped(text: str) -> str:
    """One level of JSON string escapes undone, leniently (surrogate pairs joined, a lone
    one replaced)."""

    def one(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return chr(int(match.group(1), 16))
        return _JSON_SHORT.get(match.group(2).lower(), match.group(2))

    joined = _JSON_ESCAPE.sub(one, text)
    return joined.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


_PERCENT_RUN = re.compile(r"(?:%[0-9a-f]{2})+", re.IGNORECASE)


def _keep_invalid(error: UnicodeError) -> tuple[str, int]:
    """A codec error handler: bytes that are not UTF-8 stay %-encoded."""
    assert isinstance(error, UnicodeDecodeError)
    bad = error.object[error.start : error.end]
    return "".join(f"%{byte:02x}" for byte in bad), error.end


codecs.register_error("flowforge-keep-percent", _keep_invalid)


def _percent_undone(text: str) -> str:
    """One level of %-encoding undone where it spells UTF-8; a `%F1` that does not is
    left as it is (a secret may hold one), unlike urllib's unquote."""
    return _PERCENT_RUN.sub(
        lambda run: bytes.fromhex(run.group().replace("%", "")).decode(
            "utf-8", "flowforge-keep-percent"
        ),
        text,
    )


def _references_undone(text: str) -> str:
    """One level of HTML/XML character references undone (decimal, hex, ASCII names)."""

    def one(match: re.Match[str]) -> str:
        decimal, hexadecimal, name = match.groups()
        if name is not None:
            return _ASCII_NAMES[name.lower()]
        code = int(decimal) if decimal is not None else int(hexadecimal, 16)
        return chr(code) if code <= 0x10FFFF else match.group()

    return _REFERENCE.sub(one, text)


def _folded(text: str) -> str:
    """A text as the proof compares it: case-folded, with '+' and space one character."""
    return text.casefold().replace("+", " ")


_DECODERS: tuple[Callable[[str], str], ...] = (
    _percent_undone,
    _references_undone,
    _json_unescaped,
)


def _decoding_stages(text: str) -> Iterator[str]:
    """The text and each stage of undoing one level of an encoding the redactor promises,
    as _folded compares them: each decoder alone, repeated (a secret holding what looks
    like another encoding's syntax, `%dc` or `\\f`, survives the decoders that do not
    touch it), then all three in turn (mixtures). Stops a chain when nothing changes."""
    yield _folded(text)
    if not _ENCODING_MARKS.search(text):
        return
    chains = [[decoder] for decoder in _DECODERS] + [list(_DECODERS)]
    for chain in chains:
        stage, unchanged = text, 0
        for decoder in itertools.islice(itertools.cycle(chain), DECODE_ROUNDS * len(chain)):
            step = decoder(stage)
            unchanged = unchanged + 1 if step == stage else 0
            if unchanged == len(chain):
                break
            if step != stage:
                stage = step
                yield _folded(stage)


# The longest spelling of one character: a character reference whose '&', the '&amp;'s
# escaping it NESTING times, its '#' and its ';' each take their longest plain spelling
# (a '%' JSON-escaped behind 16 backslashes, %-encoded NESTING times more, two hex
# digits: 31), with 'x', eight zeros and six hex digits. Longer than any %-encoding (4
# UTF-8 bytes of 31) or JSON escape of a character.
_LONGEST_PLAIN = 16 + len("u0025") + 2 * NESTING + 2
_LONGEST_CHAR_SPELLING = _LONGEST_PLAIN * (3 + NESTING) + len("amp") * NESTING + len("x") + 8 + 6


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
    return classify(
        step,
        rendered,
        max_response_bytes,
        lambda: netguard.send(
            rendered.method,
            rendered.url,
            headers=rendered.headers,
            body=rendered.body,
            timeout_s=rendered.timeout_s,
            allow=allow,
            max_response_bytes=max_response_bytes + rendered.redactor_reach,
            reveal_origin=not rendered.url_holds_secret,
            before_send=before_send,
        ),
    )


def classify(
    step: Step,
    rendered: Rendered,
    max_response_bytes: int,
    send: Callable[[], netguard.HttpResult],
) -> Outcome:
    """The outcome of one `send`: what it answered, or which of netguard's errors it raised.
    Apart from perform() so that `flowforge test` (flowforge/steps/offline.py) classifies a
    fixture's answer exactly as the worker classifies a real one."""
    safe = step.repeat_safe
    try:
        result = send()
    except (netguard.RequestRefused, netguard.RequestInvalid) as exc:
        # Deterministic: the same rendered request would be refused again.
        return Outcome(OutcomeKind.FAILED, error=_redact(str(exc), rendered.redactor))
    except netguard.NotSent as exc:
        # Provably never left: repeating is safe whatever the method.
        return Outcome(OutcomeKind.RETRY, error=_redact(f"not sent: {exc}", rendered.redactor))
    except netguard.SentNoResponse as exc:
        error = _redact(f"no response: {exc}", rendered.redactor)
        return Outcome(OutcomeKind.RETRY if safe else OutcomeKind.UNKNOWN, error=error)
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
            OutcomeKind.SUCCEEDED,
            output=output,
            http_status=result.status,
            duration_ms=result.duration_ms,
            response=response,
        )
    error = f"HTTP {result.status} from {rendered.method} request"
    kind = OutcomeKind.RETRY if safe and result.status in RETRYABLE_STATUS else OutcomeKind.FAILED
    return Outcome(
        kind,
        output=output,
        error=error,
        http_status=result.status,
        duration_ms=result.duration_ms,
        retry_after_s=result.retry_after_s,
        retry_at=result.retry_at,
        response=response,
    )


def _output(
    result: netguard.HttpResult, secrets: Redactor | None, max_response_bytes: int
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


def _preview(data: bytes, secrets: Redactor | None, reach: int) -> tuple[str, bool]:
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


def _parsed(text: str, secrets: Redactor | None) -> Any:
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


def _redact_json(value: Any, secrets: Redactor | None) -> Any:
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


def _redact_prefix(text: str, secrets: Redactor | None, length: int) -> str:
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
    return secrets.clean("".join(pieces))


def _redact(text: str, secrets: Redactor | None) -> str:
    """Remove secret values a server echoed back before anything is stored or logged."""
    return text if secrets is None else secrets.sub(REDACTED, text)
