"""A failure's signature (docs/contract.md#failure-groups): what makes two failed or
`unknown` executions of one workflow's step "the same failure", so that a thousand of them
are one group an operator reads, resolves and replays once.

The signature is the outcome (`failed` or `unknown`), the HTTP status class and code, the
error kind, and the error message with what varies between occurrences normalised away:
quoted values, UUIDs, numbers, hex strings and ids (any word with a digit in it). Pure: the
store computes it in the unit of work that records the failure, and tests can hold it to
its promise without a database.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flowforge.domain.model import ExecutionStatus, FailureOutcome, StepStatus, execution_event

if TYPE_CHECKING:
    from flowforge.domain.changes import Changes

# The message kept in a group (after normalising), in characters.
MAX_MESSAGE = 300
# Placeholders a normalised message shows for what it took out.
QUOTED, UUID, NUMBER, ID = "<q>", "<uuid>", "<n>", "<id>"

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_TOKEN = re.compile(r"[\w.+-]+")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_HEX = re.compile(r"0[xX][0-9a-fA-F]+|[0-9a-fA-F]{8,}")
_DIGIT = re.compile(r"\d")
_SPACES = re.compile(r"\s+")
# Punctuation that ends a sentence or a clause, kept outside the token it follows.
_TRAILING = ".,;:"
# The error kinds a message's opening names (steps/http_step.py, domain/engine.py).
_KINDS = (
    ("HTTP ", "http_status"),
    ("no response", "no_response"),
    ("not sent", "not_sent"),
    ("not run", "not_run"),
)


@dataclass(frozen=True)
class Signature:
    """One failure's signature; `digest` is what the store groups by."""

    outcome: str
    status_class: str | None
    code: int | None
    kind: str
    message: str

    @property
    def digest(self) -> str:
        """A stable hex digest of every part (the group's key beside workflow and step)."""
        parts = (
            self.outcome,
            self.status_class or "",
            str(self.code or ""),
            self.kind,
            self.message,
        )
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def _token(match: re.Match[str]) -> str:
    text = match.group(0)
    core = text.rstrip(_TRAILING)
    tail = text[len(core) :]
    if not core:
        return text
    if _UUID.fullmatch(core):
        return UUID + tail
    # Hex before numbers: "000000e0" is a hex id, not a number in exponent form.
    if _HEX.fullmatch(core) and not core.isdigit():
        return ID + tail
    if _NUMBER.fullmatch(core):
        return NUMBER + tail
    if _DIGIT.search(core):
        return ID + tail
    return text


def normalise(message: str | None) -> str:
    """The message with what varies between occurrences of one failure taken out: quoted
    values, UUIDs, numbers, hex and ids (words with a digit), whitespace collapsed."""
    if not message:
        return ""
    text = _QUOTED.sub(QUOTED, message)
    text = _TOKEN.sub(_token, text)
    return _SPACES.sub(" ", text).strip()[:MAX_MESSAGE]


def error_kind(error: str | None, http_status: int | None, fallback: str) -> str:
    """What kind of error ended the step: an HTTP status, no response, not sent, not run
    (a dependency failed), or `fallback` (the stop reason, or `error`)."""
    if http_status is not None:
        return "http_status"
    for prefix, kind in _KINDS:
        if error and error.startswith(prefix):
            return kind
    return fallback


_HTTP_CODE = re.compile(r"^HTTP (\d{3})\b")


def signature(
    outcome: str, error: str | None, http_status: int | None = None, stop_reason: str | None = None
) -> Signature:
    """The signature of one failure: `outcome` is `failed` or `unknown`, `error` the step's
    error (or None), `http_status` its last attempt's status if it had one (else read from
    an "HTTP 503 ..." message), `stop_reason` the execution's when no step failed."""
    if http_status is None and error:
        found = _HTTP_CODE.match(error)
        http_status = int(found.group(1)) if found else None
    status_class = f"{http_status // 100}xx" if http_status is not None else None
    kind = error_kind(error, http_status, stop_reason or "error")
    return Signature(outcome, status_class, http_status, kind, normalise(error))


# ---- which failure a unit of work recorded ----------------------------------------------

_FAILED_EVENT = execution_event(ExecutionStatus.FAILED)
_UNKNOWN_EVENT = execution_event(ExecutionStatus.NEEDS_ATTENTION)
_ITEM_INDEX = re.compile(r"\[\d+\]")


@dataclass(frozen=True)
class Failure:
    """What one unit of work's failure is grouped by: the step (a map item's row with its
    index taken out) and the signature."""

    step_id: str
    signature: Signature


def group_step(step_id: str) -> str:
    """The step a failure is grouped under: a map item's row without its index."""
    return _ITEM_INDEX.sub("[]", step_id)


def recorded(changes: Changes) -> Failure | None:
    """The failure `changes` records, if the execution became `failed` or needs an operator
    (`unknown`) in it; None otherwise. Cheap for every other unit of work: it looks at
    nothing unless the execution's row changed."""
    if not changes.execution_changed:
        return None
    outcome = None
    for step_id, kind, _detail in changes.events:
        if step_id is None and kind == _FAILED_EVENT:
            outcome = FailureOutcome.FAILED
        elif step_id is None and kind == _UNKNOWN_EVENT:
            outcome = FailureOutcome.UNKNOWN
    if outcome is None:
        return None
    wanted = StepStatus.FAILED if outcome == FailureOutcome.FAILED else StepStatus.UNKNOWN
    # The workflow's own step before a map item's row; then by id, so it is stable.
    culprits = sorted(
        (s for s in changes.steps.values() if s.status == wanted),
        key=lambda s: ("[" in s.step_id, s.step_id),
    )
    if not culprits:
        return Failure("", signature(outcome.value, None, None, changes.stop_reason))
    step = culprits[0]
    status = None
    for attempt in changes.new_attempts:
        if attempt.step_id == step.step_id and attempt.http_status is not None:
            status = attempt.http_status
    for closed in changes.finished_attempts:
        if closed.step_id == step.step_id and closed.http_status is not None:
            status = closed.http_status
    sig = signature(outcome.value, step.error, status, changes.stop_reason)
    return Failure(group_step(step.step_id), sig)
