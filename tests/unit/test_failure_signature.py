"""The failure signature (flowforge/domain/failures.py, docs/contract.md#failure-groups):
what varies between occurrences of one failure never splits its group, and what tells two
failures apart always does."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowforge.domain.failures import MAX_MESSAGE, error_kind, normalise, signature

SETTINGS = settings(max_examples=300, deadline=None)


@pytest.mark.parametrize(
    ("message", "normalised"),
    [
        ("HTTP 503 from POST request", "HTTP <n> from POST request"),
        ("order 12345 not found", "order <n> not found"),
        ("order ord_8Fk2x9 not found", "order <id> not found"),
        ("customer cus-42 is locked.", "customer <id> is locked."),
        (f"execution {uuid.UUID(int=7)} gone", "execution <uuid> gone"),
        ("sha deadbeefcafe mismatch", "sha <id> mismatch"),
        ("pointer 0x7ffe12 bad", "pointer <id> bad"),
        ("amount -12.50, limit 1e3", "amount <n>, limit <n>"),
        ("sku 'ABC DEF' and \"x y\" and `z`", "sku <q> and <q> and <q>"),
        ("  many   spaces\there \n", "many spaces here"),
        ("no response: timed out after 30.0s", "no response: timed out after <id>"),
        ("plain words stay", "plain words stay"),
        ("", ""),
    ],
)
def test_normalise(message: str, normalised: str) -> None:
    assert normalise(message) == normalised


def test_normalise_none_and_cap() -> None:
    assert normalise(None) == ""
    assert len(normalise("word " * 500)) == MAX_MESSAGE


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        ("HTTP 502 from GET request", 502, "http_status"),
        ("no response: connection reset", None, "no_response"),
        ("not sent: connection refused", None, "not_sent"),
        ("not run: step a failed", None, "not_run"),
        ("address 10.0.0.1 is not allowed", None, "error"),
        (None, None, "error"),
    ],
)
def test_error_kind(error: str | None, status: int | None, kind: str) -> None:
    assert error_kind(error, status, "error") == kind


def test_signature_parts() -> None:
    sig = signature("failed", "HTTP 503 from POST request")
    assert (sig.outcome, sig.status_class, sig.code, sig.kind) == (
        "failed",
        "5xx",
        503,
        "http_status",
    )
    assert sig.message == "HTTP <n> from POST request"
    assert signature("failed", "boom", 404).status_class == "4xx"
    stopped = signature("failed", None, stop_reason="deadline")
    assert (stopped.kind, stopped.code, stopped.message) == ("deadline", None, "")


def test_what_splits_groups() -> None:
    base = signature("failed", "HTTP 503 from POST request").digest
    assert signature("failed", "HTTP 503 from POST request").digest == base
    assert signature("unknown", "HTTP 503 from POST request").digest != base
    assert signature("failed", "HTTP 502 from POST request").digest != base
    assert signature("failed", "HTTP 503 from GET request").digest != base
    assert (
        signature("failed", "order 1 missing").digest
        != signature("failed", "item 1 missing").digest
    )
    assert len(base) == 32


# ---- the property: values that vary never split a group -------------------------------

words = st.from_regex(r"[A-Za-z]{1,8}", fullmatch=True)
numbers = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12).map(str),
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False).map(lambda f: f"{f:.3f}"),
)
ids = st.from_regex(r"[a-z]{1,5}[_-][a-z0-9]{0,4}[0-9][a-zA-Z0-9]{0,6}", fullmatch=True)
hexes = st.from_regex(r"[0-9a-f]{8,40}", fullmatch=True).filter(lambda h: not h.isdigit())
uuids = st.uuids().map(str)
quoted = st.text(alphabet=st.characters(blacklist_characters="'\n"), max_size=12).map(
    lambda t: f"'{t}'"
)
KINDS = {"number": numbers, "id": ids, "hex": hexes, "uuid": uuids, "quoted": quoted}
punctuation = st.sampled_from(["", ".", ",", ":", ";"])


@st.composite
def templates(draw: st.DrawFn) -> list[tuple[str, str]]:
    """A message as parts: ("word", text) or (kind, trailing punctuation)."""
    parts = []
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        if draw(st.booleans()):
            parts.append(("word", draw(words)))
        else:
            parts.append((draw(st.sampled_from(sorted(KINDS))), draw(punctuation)))
    return parts


def _fill(draw: st.DrawFn, parts: list[tuple[str, str]]) -> str:
    out = []
    for kind, extra in parts:
        out.append(extra if kind == "word" else draw(KINDS[kind]) + extra)
    return " ".join(out)


@SETTINGS
@given(st.data(), templates(), st.sampled_from(["failed", "unknown"]))
def test_varying_values_never_split_a_group(data: st.DataObject, parts, outcome: str) -> None:
    first = _fill(data.draw, parts)
    second = _fill(data.draw, parts)
    assert normalise(first) == normalise(second)
    assert signature(outcome, first).digest == signature(outcome, second).digest


@SETTINGS
@given(st.lists(words, min_size=1, max_size=6).map(" ".join), st.integers(100, 599))
def test_words_are_kept(message: str, status: int) -> None:
    assert normalise(message) == message
    assert signature("failed", message, status).code == status


# ---- which failure a unit of work records ----------------------------------------------

from flowforge.domain.changes import Changes, FinishedAttempt, StepState  # noqa: E402
from flowforge.domain.failures import recorded  # noqa: E402


def _changes(status: str, *steps: StepState, reason: str | None = None) -> Changes:
    changes = Changes("e1", execution_changed=True, status=status, stop_reason=reason)
    changes.events.append((None, f"execution.{status}", {"from": "running", "to": status}))
    changes.steps = {s.step_id: s for s in steps}
    return changes


def test_recorded_names_the_failed_step_and_its_status() -> None:
    failed = StepState("charge", "http_request", "failed", error="HTTP 503 from POST request")
    changes = _changes("failed", failed, StepState("after", "transform", "cancelled", error="x"))
    changes.finished_attempts.append(FinishedAttempt("charge", 1, "failed", http_status=503))
    found = recorded(changes)
    assert found is not None and found.step_id == "charge"
    assert (found.signature.outcome, found.signature.code) == ("failed", 503)


def test_recorded_unknown_items_and_stops() -> None:
    unknown = StepState("items[7].send", "http_request", "unknown", error="no response: reset")
    found = recorded(_changes("needs_attention", unknown))
    assert found is not None and found.step_id == "items[].send"
    assert (found.signature.outcome, found.signature.kind) == ("unknown", "no_response")
    stopped = recorded(_changes("failed", reason="deadline"))
    assert stopped is not None and (stopped.step_id, stopped.signature.kind) == ("", "deadline")


def test_nothing_is_recorded_off_the_failure_path() -> None:
    assert recorded(Changes("e1")) is None
    assert recorded(_changes("succeeded")) is None
    quiet = Changes("e1", execution_changed=True, status="failed")  # no transition event
    assert recorded(quiet) is None
