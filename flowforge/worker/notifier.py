"""The notifier thread: operational notifications out (docs/contract.md#notifications).

Each pass gathers the events the triggers of sql/0060 recorded into one message per
endpoint and window (`notifications.coalesce`), then sends the due messages through the
address guard of steps/netguard.py, signed the Standard Webhooks way or in Slack's
incoming-webhook shape. A thread of its own, beside the executors: a slow or dead
receiver delays only other notifications, never an execution, whose events were already
committed with its own change.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import psycopg_pool

from flowforge.domain.model import NotifyShape
from flowforge.steps import netguard
from flowforge.store import notifications
from flowforge.store.db import wrap_exceptions
from flowforge.trust import signatures
from flowforge.worker.loop import Loop

logger = logging.getLogger(__name__)

PASS_S = 1.0
BATCH = 20
# How long one attempt may take; a message is claimed for a little longer.
SEND_TIMEOUT_S = 10.0
CLAIM_S = 3 * SEND_TIMEOUT_S
MAX_RESPONSE_BYTES = 4096
# How often old messages are forgotten (notifications.forget).
FORGET_EVERY_S = 3600.0


class Notifier(Loop):
    """Coalesces events into messages and sends the due ones, once a second."""

    interval = PASS_S

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        stop: threading.Event,
        *,
        allow: netguard.Allowlist,
        window_s: float,
        disable_after_s: float,
    ) -> None:
        super().__init__("notifier", stop)
        self.pool = pool
        self.allow = allow
        self.window_s = window_s
        self.disable_after_s = disable_after_s
        self.forgotten_at = 0.0

    def step(self) -> float:
        with wrap_exceptions(), self.pool.connection() as conn:
            if time.monotonic() - self.forgotten_at > FORGET_EVERY_S:
                notifications.forget(conn)
                self.forgotten_at = time.monotonic()
            notifications.coalesce(conn, self.window_s)
            due = notifications.claim_due(conn, BATCH, CLAIM_S)
        for message in due:
            if self.stop.is_set():
                break
            self.send(message)
        return 0.0 if len(due) == BATCH else self.interval

    def send(self, message: notifications.Message) -> None:
        """One attempt, its outcome recorded (never across an open transaction)."""
        body, headers = render(message)
        status: int | None = None
        retry_after_s: float | None = None
        try:
            result = netguard.send(
                "POST",
                message.url,
                headers=headers,
                body=body,
                timeout_s=SEND_TIMEOUT_S,
                allow=self.allow,
                max_response_bytes=MAX_RESPONSE_BYTES,
            )
            status, retry_after_s = result.status, result.retry_after_s
            error = "" if 200 <= status < 300 else f"HTTP {status}"
        except (netguard.NotSent, netguard.SentNoResponse) as exc:
            error = str(exc)
        with wrap_exceptions(), self.pool.connection() as conn:
            if status is not None and 200 <= status < 300:
                notifications.delivered(conn, message, status)
                return
            reason = notifications.failed(
                conn,
                message,
                status=status,
                error=error,
                retry_after_s=retry_after_s,
                disable_after_s=self.disable_after_s,
            )
        logger.warning(
            "notification not delivered",
            extra={"message_id": message.message_id, "error": error, "disabled": reason},
        )


def render(message: notifications.Message) -> tuple[bytes, dict[str, str]]:
    """The request body and headers of one message in its endpoint's shape."""
    headers = {"Content-Type": "application/json", "User-Agent": "FlowForge-Notifier"}
    if message.shape == NotifyShape.SLACK:
        return json.dumps({"text": slack_text(message.payload)}).encode(), headers
    body = json.dumps(message.payload, separators=(",", ":")).encode()
    timestamp = int(time.time())
    headers["webhook-id"] = message.message_id
    headers["webhook-timestamp"] = str(timestamp)
    assert message.secret is not None, "a standard endpoint always has its secret"
    headers["webhook-signature"] = signatures.sign(
        message.secret, message.message_id, timestamp, body
    )
    return body, headers


def slack_text(payload: dict[str, object]) -> str:
    """One line per kind, then the shown events, as Slack's incoming webhooks take text."""
    data = payload["data"]
    assert isinstance(data, dict)
    lines = [f"FlowForge: {n} x {kind}" for kind, n in data["kinds"].items()]
    for event in data["events"]:
        where = event["workflow"] or "-"
        lines.append(f"• {event['kind']} {where} {event['execution_id'] or ''}".rstrip())
    if data["omitted"]:
        lines.append(f"… and {data['omitted']} more")
    return "\n".join(lines)
