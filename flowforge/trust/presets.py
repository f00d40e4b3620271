"""Webhook auth presets (docs/contract.md#presets): each provider's signature checked as the
provider documents it, and the provider's delivery id taken as the webhook's identity.

- signature (Standard Webhooks): `webhook-signature: v1,<b64>` over `id.timestamp.body`,
  webhook-timestamp within tolerance; identity `webhook-id` (signed).
- stripe: `Stripe-Signature: t=…,v1=<hex>,…` over `t.body`, `t` within tolerance;
  identity the event `id` in the body (signed).
- github: `X-Hub-Signature-256: sha256=<hex>` over the body, no timestamp; identity
  `X-GitHub-Delivery`. A signed `ping` (sent when the hook is created) starts nothing.
- shopify: `X-Shopify-Hmac-Sha256: <b64>` over the body, no timestamp; identity
  `X-Shopify-Webhook-Id`.
- slack: `X-Slack-Signature: v0=<hex>` over `v0:timestamp:body`, X-Slack-Request-Timestamp
  within tolerance; identity `event_id` in the body (signed).

GitHub and Shopify sign neither a timestamp nor their delivery id: a captured delivery
verifies forever, and resent with another delivery id it is a new webhook. That is the
providers' scheme, not something a receiver can repair; docs/howto/ says so.

A signed Stripe or Slack body without its identity member (`id`, `event_id`) is
identified by what its signature covers instead: `signed:<timestamp>:<sha256 of the
body>` (signed_identity). A captured request resent within the tolerance is then the
same delivery, never another execution (docs/reference/security.md).

Every check is constant-time over the candidate signatures and needs no database: the
caller passes the active secrets it already holds (intake.Targets caches them).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flowforge.domain.model import WebhookAuth
from flowforge.trust import signatures
from flowforge.trust.signatures import TOLERANCE_S, SignatureInvalid


class Headers(Protocol):
    """What is read of request headers (werkzeug's Headers, a dict): case-insensitive
    lookups are the caller's business."""

    def get(self, key: str) -> str | None: ...


# The auth values whose webhooks carry a signature to check.
SIGNED = frozenset(auth for auth in WebhookAuth if auth is not WebhookAuth.NONE)
_TIMESTAMP = re.compile(r"[0-9]{1,15}")
_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


@dataclass(frozen=True)
class Verified:
    """A webhook proven to come from a secret holder."""

    secret: str  # the active secret that signed it
    identity: str | None  # the provider's delivery id, None when the delivery has none
    challenge: str | None = None  # Slack url_verification: answer this, start nothing
    ping: bool = False  # GitHub's ping: answer 200, start nothing


def verify(
    auth: str,
    secrets: Sequence[str],
    headers: Headers,
    body: bytes,
    now: float,
) -> Verified:
    """Check a webhook against the active secrets under preset `auth`, or raise
    SignatureInvalid (401) saying what is wrong, never which secret came close."""
    return _VERIFIERS[WebhookAuth(auth)](secrets, headers, body, now)


def _standard(secrets: Sequence[str], headers: Headers, body: bytes, now: float) -> Verified:
    msg_id = headers.get("webhook-id")
    secret = signatures.verify(
        secrets,
        msg_id,
        headers.get("webhook-timestamp"),
        headers.get("webhook-signature"),
        body,
        now,
    )
    return Verified(secret, msg_id)


def _stripe(secrets: Sequence[str], headers: Headers, body: bytes, now: float) -> Verified:
    """stripe.com/docs/webhooks#verify-manually: `t=` and one `v1=` per signing secret
    (several while a secret is rolled), HMAC-SHA256 hex of `t.` + body keyed with the
    whole `whsec_…` string, and the timestamp within the tolerance."""
    header = _required(headers, "Stripe-Signature")
    timestamp: str | None = None
    candidates: list[bytes] = []
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        if name == "t":
            timestamp = value
        elif name == "v1":
            candidates.append(_hex(value, "Stripe-Signature v1"))
    if timestamp is None:
        raise SignatureInvalid("no t= timestamp in Stripe-Signature header")
    if not candidates:
        raise SignatureInvalid("no v1 signature in Stripe-Signature header")
    _fresh(timestamp, now, "Stripe-Signature t")
    secret = _match(secrets, timestamp.encode() + b"." + body, candidates, hashlib.sha256)
    return Verified(secret, _body_string(body, "id") or signed_identity(timestamp, body))


def _github(secrets: Sequence[str], headers: Headers, body: bytes, now: float) -> Verified:
    """docs.github.com "Validating webhook deliveries": `sha256=` + HMAC-SHA256 hex of
    the body; X-GitHub-Delivery (a GUID, the same on a redelivery) is the identity."""
    header = _required(headers, "X-Hub-Signature-256")
    scheme, _, value = header.partition("=")
    if scheme != "sha256":
        raise SignatureInvalid("X-Hub-Signature-256 must be sha256=<hex>")
    delivery = _required(headers, "X-GitHub-Delivery")
    secret = _match(secrets, body, [_hex(value, "X-Hub-Signature-256")], hashlib.sha256)
    # X-GitHub-Event is not signed: a captured event relabelled `ping` starts nothing,
    # which is no more than withholding it.
    return Verified(secret, delivery, ping=headers.get("X-GitHub-Event") == "ping")


def _shopify(secrets: Sequence[str], headers: Headers, body: bytes, now: float) -> Verified:
    """shopify.dev "Verify webhooks": base64 of HMAC-SHA256 of the body keyed with the
    app's client secret; X-Shopify-Webhook-Id (the same on a retry) is the identity."""
    header = _required(headers, "X-Shopify-Hmac-Sha256")
    try:
        candidate = base64.b64decode(header, validate=True)
    except binascii.Error:
        raise SignatureInvalid("X-Shopify-Hmac-Sha256 is not base64") from None
    delivery = _required(headers, "X-Shopify-Webhook-Id")
    return Verified(_match(secrets, body, [candidate], hashlib.sha256), delivery)


def _slack(secrets: Sequence[str], headers: Headers, body: bytes, now: float) -> Verified:
    """api.slack.com "Verifying requests from Slack": `v0=` + HMAC-SHA256 hex of
    `v0:<X-Slack-Request-Timestamp>:<body>`, the timestamp within five minutes. A signed
    `url_verification` is answered with its challenge; `event_id` (kept by retries, which
    add X-Slack-Retry-Num) is the identity."""
    header = _required(headers, "X-Slack-Signature")
    timestamp = _required(headers, "X-Slack-Request-Timestamp")
    version, _, value = header.partition("=")
    if version != "v0":
        raise SignatureInvalid("X-Slack-Signature must be v0=<hex>")
    _fresh(timestamp, now, "X-Slack-Request-Timestamp")
    content = b"v0:" + timestamp.encode() + b":" + body
    secret = _match(secrets, content, [_hex(value, "X-Slack-Signature")], hashlib.sha256)
    parsed = _json_object(body)
    challenge = None
    if parsed.get("type") == "url_verification" and isinstance(parsed.get("challenge"), str):
        challenge = parsed["challenge"]
    identity = _body_string(body, "event_id", parsed) or signed_identity(timestamp, body)
    return Verified(secret, identity, challenge)


def signed_identity(timestamp: str, body: bytes) -> str:
    """The identity of a signed delivery whose body names none: what its signature
    covers (the signed timestamp and the body), so resending the captured request is the
    same delivery, and the provider signing the body anew is another."""
    return f"signed:{timestamp}:{hashlib.sha256(body).hexdigest()}"


def _required(headers: Headers, name: str) -> str:
    value = headers.get(name)
    if not value:
        raise SignatureInvalid(f"missing {name} header")
    return value


def _hex(value: str, where: str) -> bytes:
    if not _HEX_SHA256.fullmatch(value):
        raise SignatureInvalid(f"{where} is not a hex SHA-256 signature")
    return bytes.fromhex(value)


def _fresh(timestamp: str, now: float, where: str) -> None:
    """Refuse a stale or a future timestamp: an old capture cannot be replayed later."""
    if not _TIMESTAMP.fullmatch(timestamp):
        raise SignatureInvalid(f"{where} is not an integer number of seconds")
    if abs(now - int(timestamp)) > TOLERANCE_S:
        raise SignatureInvalid("timestamp outside tolerance")


def _match(
    secrets: Sequence[str],
    content: bytes,
    candidates: Sequence[bytes],
    digest: Callable[[], Any],
) -> str:
    """The first active secret whose HMAC of `content` equals one candidate."""
    for secret in secrets:
        expected = hmac.new(secret.encode(), content, digest).digest()
        if any(hmac.compare_digest(expected, candidate) for candidate in candidates):
            return secret
    raise SignatureInvalid("no matching signature")


def _json_object(body: bytes) -> dict[str, Any]:
    """The signed body as an object, or {} (a body that is no JSON is refused later, 400)."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _body_string(body: bytes, name: str, parsed: dict[str, Any] | None = None) -> str | None:
    """A top-level string member of the signed body: covered by the signature, so the
    identity it names cannot be changed without the secret."""
    value = (_json_object(body) if parsed is None else parsed).get(name)
    return value if isinstance(value, str) and value else None


_VERIFIERS: dict[WebhookAuth, Callable[[Sequence[str], Headers, bytes, float], Verified]]
_VERIFIERS = {
    WebhookAuth.SIGNATURE: _standard,
    WebhookAuth.STRIPE: _stripe,
    WebhookAuth.GITHUB: _github,
    WebhookAuth.SHOPIFY: _shopify,
    WebhookAuth.SLACK: _slack,
}
