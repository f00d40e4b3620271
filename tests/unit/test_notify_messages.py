"""What one notification looks like on the wire (docs/contract.md#notifications): signed so
that FlowForge's own verifier and the Standard Webhooks library accept it, counted and
sampled in one message per window, and retried on the documented schedule."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from flowforge.store import notifications
from flowforge.trust import sealing, signatures
from flowforge.worker.notifier import render, slack_text

AT = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def _events(count: int, kind: str = "execution.failed") -> list[tuple[object, ...]]:
    return [(kind, "orders", uuid.uuid4(), {"status": "failed"}, AT) for _ in range(count)]


KEY = sealing.parse_key(sealing.new_key())
URL = "http://127.0.0.1:9/n"


def _message(shape: str, payload: dict[str, object]) -> notifications.Message:
    """A claimed message as the worker gets it: its endpoint's secret (a Slack one's URL)
    sealed for endpoint 1."""
    value = signatures.new_secret() if shape == "standard" else URL
    sealed = sealing.seal(KEY, value, 0, 1, notifications.SEALED_TABLE)
    shown = URL if shape == "standard" else notifications.mask(URL)
    return notifications.Message(str(uuid.uuid4()), 1, payload, AT, 1, shown, shape, None, sealed)


def test_a_standard_message_verifies_both_ways() -> None:
    message = _message("standard", notifications.batch_payload("oncall", _events(3)))
    url, secret = message.opened(KEY)
    body, headers = render(message, secret)
    assert url == URL and secret is not None
    assert headers["webhook-id"] == message.message_id
    verified = Webhook(secret).verify(body, headers)
    assert verified["data"]["count"] == 3
    signatures.verify(
        [secret],
        headers["webhook-id"],
        headers["webhook-timestamp"],
        headers["webhook-signature"],
        body,
        time.time(),
    )


def test_a_window_is_counted_and_sampled() -> None:
    events = _events(1000) + _events(5, "outcome.unknown")
    payload = notifications.batch_payload("oncall", events)
    assert payload["type"] == "notification.batch"
    data = payload["data"]
    assert data["count"] == 1005
    assert data["kinds"] == {"execution.failed": 1000, "outcome.unknown": 5}
    assert len(data["events"]) == notifications.SAMPLES and data["omitted"] == 985
    assert len(json.dumps(payload)) < 8192  # bounded, however large the burst


def test_slack_gets_text_and_no_signature() -> None:
    message = _message("slack", notifications.batch_payload("oncall", _events(25)))
    assert message.url == "http://127.0.0.1:9/…" and message.opened(KEY) == (URL, None)
    body, headers = render(message, None)
    assert "webhook-signature" not in headers
    text = json.loads(body)["text"]
    assert text.startswith("FlowForge: 25 x execution.failed") and "and 5 more" in text
    assert slack_text(message.payload) == text


def test_retries_follow_the_schedule_then_give_up() -> None:
    for attempt, base in enumerate(notifications.BACKOFF_S, start=1):
        wait = notifications.next_retry(attempt, None)
        assert wait is not None and base <= wait <= base * 1.2
    assert notifications.next_retry(len(notifications.BACKOFF_S) + 1, None) is None
    assert notifications.next_retry(1, 2.0) == 2.0  # the receiver's Retry-After
    assert notifications.next_retry(1, 10**9) == notifications.RETRY_AFTER_MAX_S


def test_a_sealed_secret_opens_only_with_its_key_for_its_row() -> None:
    message = _message("standard", notifications.batch_payload("oncall", _events(1)))
    with pytest.raises(sealing.SecretUnreadable):
        message.opened(sealing.parse_key(sealing.new_key()))
    with pytest.raises(sealing.SecretUnreadable):
        dataclasses.replace(message, endpoint_id=2).opened(KEY)  # copied to another row
    with pytest.raises(sealing.EncryptionKeyMissing):
        message.opened(None)
