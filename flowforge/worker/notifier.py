"""The notifier thread: operational notifications out (docs/contract.md#notifications).

Each pass gathers the events the triggers of sql/0060 recorded into one message per
endpoint and window (`notifications.coalesce`), then sends the due messages through the
address guard of steps/netguard.py, signed the Standard Webhooks way or in Slack's
incoming-webhook shape. A thread of its own, beside the executors, never delays an
execution, whose events were already committed with its own change; its sends run on a
few threads of their own, one endpoint each, so a slow or dead receiver holds only its
own messages. While no endpoint is enabled it runs no query but one a minute: enabling
one wakes it through the relay's LISTEN connection.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg_pool

from flowforge.domain.model import NotifyShape
from flowforge.steps import netguard
from flowforge.store import notifications
from flowforge.store.db import wrap_exceptions
from flowforge.trust import sealing, signatures
from flowforge.worker.loop import Loop, report

logger = logging.getLogger(__name__)

PASS_S = 1.0
# While no endpoint is enabled the notifier asks only this often whether one is: enabling
# one wakes it at once (notifications.WAKE, heard by the relay), this is the fallback.
IDLE_S = 60.0
# How often a sleeping notifier looks at its stop flag (no query).
STOP_CHECK_S = 1.0
# Endpoints sent to at once: a slow receiver holds one of these, never the others' messages.
SENDERS = 4
# How long one attempt may take (connecting, then the exchange); a message is claimed
# for a little longer.
SEND_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
CLAIM_S = 3 * SEND_TIMEOUT_S
MAX_RESPONSE_BYTES = 4096
# How often old messages are forgotten (notifications.forget).
FORGET_EVERY_S = 3600.0


class Notifier(Loop):
    """Coalesces events into messages and sends the due ones, once a second while some
    endpoint is enabled; otherwise one question a minute, or none until an endpoint is
    enabled (docs/contract.md#notifications: no endpoint, no cost)."""

    interval = PASS_S

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        stop: threading.Event,
        *,
        allow: netguard.Allowlist,
        window_s: float,
        disable_after_s: float,
        key: bytes | None = None,
    ) -> None:
        super().__init__("notifier", stop)
        self.pool = pool
        self.allow = allow
        self.window_s = window_s
        self.disable_after_s = disable_after_s
        self.key = key
        self.forgotten_at = 0.0
        self.woken = threading.Event()
        self.senders = ThreadPoolExecutor(SENDERS, thread_name_prefix="notifier-send")
        # Endpoints this notifier is sending to (a task of `senders` each); guarded by _lock.
        self.busy: set[int] = set()
        self._lock = threading.Lock()

    def wake(self) -> None:
        """An endpoint was enabled: pass now, not after IDLE_S (the relay calls this)."""
        self.woken.set()

    def idle(self, seconds: float) -> bool:
        """Sleep `seconds` or until woken; True once the worker stops."""
        deadline = time.monotonic() + seconds
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.woken.wait(min(left, STOP_CHECK_S)):
                self.woken.clear()
                return False
        return True

    def step(self) -> float:
        with wrap_exceptions(), self.pool.connection() as conn:
            if time.monotonic() - self.forgotten_at > FORGET_EVERY_S:
                notifications.forget(conn)
                self.forgotten_at = time.monotonic()
            if not notifications.any_enabled(conn):
                return IDLE_S
            notifications.rearm_queues(conn)
            notifications.coalesce(conn, self.window_s)
            with self._lock:
                busy = sorted(self.busy)
            # No more than the free senders take at once: a claimed message never waits
            # for a sender behind a slow receiver (its claim would run out meanwhile).
            free = SENDERS - len(busy)
            claimed_at = time.monotonic()  # before the claim: its end is no earlier
            due = notifications.claim_due(conn, free, CLAIM_S, busy) if free > 0 else []
        by_endpoint: dict[int, list[notifications.Message]] = {}
        for message in due:
            by_endpoint.setdefault(message.endpoint_id, []).append(message)
        for endpoint_id, messages in by_endpoint.items():
            with self._lock:
                self.busy.add(endpoint_id)
            self.senders.submit(self._send_all, endpoint_id, messages, claimed_at)
        return 0.0 if due and len(due) == free and len(by_endpoint) < free else self.interval

    def _send_all(
        self, endpoint_id: int, messages: list[notifications.Message], claimed_at: float
    ) -> None:
        """One endpoint's messages in order, on a sender thread; an error is logged, and
        what was not sent is due again when its claim ends. No attempt starts that the
        claim left could not cover: behind a slow receiver it would still be in flight
        when another worker's notifier claims and sends the same message."""
        try:
            for message in messages:
                attempt_s = CONNECT_TIMEOUT_S + SEND_TIMEOUT_S
                if self.stop.is_set() or time.monotonic() - claimed_at + attempt_s > CLAIM_S:
                    break
                self.send(message)
        except Exception as exc:
            report("notifier-send", exc)
        finally:
            with self._lock:
                self.busy.discard(endpoint_id)

    def close(self) -> None:
        """Sends under way end by their timeout; unsent claimed messages fall due again."""
        self.senders.shutdown(wait=False, cancel_futures=True)

    def send(self, message: notifications.Message) -> None:
        """One attempt, its outcome recorded (never across an open transaction)."""
        status: int | None = None
        retry_after_s: float | None = None
        try:
            url, secret = message.opened(self.key)
            body, headers = render(message, secret)
            result = netguard.send(
                "POST",
                url,
                headers=headers,
                body=body,
                timeout_s=SEND_TIMEOUT_S,
                connect_timeout_s=CONNECT_TIMEOUT_S,
                allow=self.allow,
                max_response_bytes=MAX_RESPONSE_BYTES,
            )
            status, retry_after_s = result.status, result.retry_after_s
            error = "" if 200 <= status < 300 else f"HTTP {status}"
        except notifications.NotifyKeyMissing:
            # Not this worker's to send: recorded as a failure, it would count toward
            # disabling a healthy endpoint. A worker with the key takes it when its claim ends.
            logger.warning(
                "notification left for a worker with FLOWFORGE_NOTIFY_KEY",
                extra={"message_id": message.message_id},
            )
            return
        except (netguard.NotSent, netguard.SentNoResponse, sealing.EncryptionKeyMissing) as exc:
            error = str(exc)
        except sealing.SecretUnreadable:
            error = "the endpoint's secret does not open with FLOWFORGE_NOTIFY_KEY"
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


def render(message: notifications.Message, secret: str | None) -> tuple[bytes, dict[str, str]]:
    """The request body and headers of one message in its endpoint's shape, signed with
    `secret` (a standard endpoint's)."""
    headers = {"Content-Type": "application/json", "User-Agent": "FlowForge-Notifier"}
    if message.shape == NotifyShape.SLACK:
        return json.dumps({"text": slack_text(message.payload)}).encode(), headers
    body = json.dumps(message.payload, separators=(",", ":")).encode()
    timestamp = int(time.time())
    headers["webhook-id"] = message.message_id
    headers["webhook-timestamp"] = str(timestamp)
    assert secret is not None, "a standard endpoint always has its secret"
    headers["webhook-signature"] = signatures.sign(secret, message.message_id, timestamp, body)
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
