"""Resume URLs of `wait` steps (docs/contract.md#wait): tokens that are derived, never stored.

A token names its execution and step and carries HMAC-SHA256 over both under the resume
key, so nothing in PostgreSQL can turn back into a token: a dump holds no resume URL, and
a forged or altered token is refused before any query (in constant time, and whatever
exists in the database — a 404 says nothing about executions).

The resume key is its own secret, `FLOWFORGE_RESUME_KEY` or the systemd credential
`resume_key` (32 random bytes, base64url, made by `python -m flowforge.store.waits`), and not
FLOWFORGE_ENCRYPTION_KEY: the worker must render resume URLs, and the encryption key,
which opens webhook signing secrets, stays out of the worker. Rotating the resume key
invalidates every resume URL handed out so far.

Layout of a token: `ffw1_` then base64url(execution uuid (16 bytes) + MAC (32 bytes) +
step id (ASCII) [+ "." + round]); the MAC covers a label, the execution, the step and its
round. The round is the wait step's fencing token, which a retry of the execution bumps
(engine.Run.retry): a retried wait reopens under a new URL, and a URL leaked in an earlier
round answers 410. Round 0 (a step never retried) has no suffix, as before rounds existed,
so URLs handed out before the upgrade keep working.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import uuid
from dataclasses import dataclass, field

from flowforge.domain.definitions.shapes import is_step_id
from flowforge.domain.templating import TemplateError
from flowforge.trust import sealing

PREFIX = "ffw1_"
_LABEL = b"flowforge:resume-token:v1:"
_MAC_BYTES = 32
_UUID_BYTES = 16
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,200}")
RESUME_PATH = "/hooks/resume/"


class ResumeUnavailable(TemplateError):
    """A resume URL cannot be rendered: FLOWFORGE_PUBLIC_URL or FLOWFORGE_RESUME_KEY is
    not set on the worker."""


@dataclass(frozen=True)
class ResumeUrls:
    """What renders `{{ waits.<step>.url }}`: the public base URL and the resume key."""

    public_url: str | None
    key: bytes | None = field(repr=False)

    def url(self, execution_id: str, step_id: str, round_: int = 0) -> str:
        """The absolute resume URL of one wait step of one execution, in one round."""
        name = "{{ waits." + step_id + ".url }}"
        if self.public_url is None:
            raise ResumeUnavailable(
                f"{name}: FLOWFORGE_PUBLIC_URL is not set on the worker; set it to the address"
                " callers reach the API at (such as https://flowforge.example.com)"
            )
        if self.key is None:
            raise ResumeUnavailable(
                f"{name}: FLOWFORGE_RESUME_KEY is not set on the worker (the same key as the"
                " API's; make one with: python -m flowforge.store.waits)"
            )
        return self.public_url + RESUME_PATH + token(self.key, execution_id, step_id, round_)


def _named(step_id: str, round_: int) -> bytes:
    """The step part of a token: its id, and its round unless 0 (ids have no '.')."""
    return (step_id if round_ == 0 else f"{step_id}.{round_}").encode("ascii")


def _mac(key: bytes, execution: bytes, named: bytes) -> bytes:
    return hmac.new(key, _LABEL + execution + named, hashlib.sha256).digest()


def token(key: bytes, execution_id: str, step_id: str, round_: int = 0) -> str:
    """The resume token of (execution, step, round): 256 bits of MAC, bound to all three."""
    execution = uuid.UUID(execution_id).bytes
    named = _named(step_id, round_)
    raw = execution + _mac(key, execution, named) + named
    return PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def verify(key: bytes, presented: str) -> tuple[str, str, int] | None:
    """The (execution id, step id, round) a genuine token names, else None.

    The MAC is recomputed and compared with hmac.compare_digest before anything is looked
    up, so a guessed token costs the same whether or not its execution exists."""
    if not presented.startswith(PREFIX) or not _TOKEN.fullmatch(presented[len(PREFIX) :]):
        return None
    body = presented[len(PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        return None
    execution, mac = raw[:_UUID_BYTES], raw[_UUID_BYTES : _UUID_BYTES + _MAC_BYTES]
    named = raw[_UUID_BYTES + _MAC_BYTES :]
    step_id, dot, round_text = named.decode("ascii", errors="replace").partition(".")
    if len(mac) != _MAC_BYTES or not is_step_id(step_id):
        return None
    if dot and not (round_text.isascii() and round_text.isdigit() and round_text[0] != "0"):
        return None  # one spelling per round: "a.01" or "a.0" is no token
    if not hmac.compare_digest(_mac(key, execution, named), mac):
        return None
    return str(uuid.UUID(bytes=execution)), step_id, int(round_text or 0)


def loggable_path(path: str | None) -> str | None:
    """A request path fit for a log line: a resume URL's token is a credential."""
    if path is not None and path.startswith(RESUME_PATH):
        return RESUME_PATH + "[redacted]"
    return path


def body_sha256(raw: bytes) -> bytes:
    """What decides whether a second resume is a replay (same bytes) or a conflict."""
    return hashlib.sha256(raw).digest()


def parse_key(text: str) -> bytes:
    """A resume key in the format of the encryption key (32 bytes, base64url)."""
    return sealing.parse_key(text)
