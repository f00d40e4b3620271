"""Standard Webhooks verification, so only holders of a workflow's secret can start it."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Sequence
from secrets import token_bytes

from flowforge.errors import ClientError

TOLERANCE_S = 300
_PREFIX = "whsec_"
_TIMESTAMP = re.compile(r"[0-9]{1,15}")


class SignatureInvalid(ClientError):
    """The webhook is not provably from a secret holder; the message is safe to return."""

    status = 401
    title = "Invalid signature"


def new_secret() -> str:
    """Make a signing secret in the whsec_ format that Standard Webhooks senders expect."""
    return _PREFIX + base64.b64encode(token_bytes(24)).decode("ascii")


def _key(secret: str) -> bytes | None:
    """Decode a stored secret, or None for one that is no Standard Webhooks secret (a
    provider's secret supplied by the user, kept while a workflow changes its auth): it
    can sign nothing here."""
    if not secret.startswith(_PREFIX):
        return None
    try:
        return base64.b64decode(secret.removeprefix(_PREFIX), validate=True) or None
    except binascii.Error:
        return None


def is_secret(value: str) -> bool:
    """Whether `value` is usable as a Standard Webhooks secret (whsec_ + base64)."""
    return _key(value) is not None


def _candidates(signature_header: str) -> list[bytes]:
    """Collect the v1 signatures; other versions are skipped so senders can add schemes."""
    found: list[bytes] = []
    for entry in signature_header.split():
        version, _, encoded = entry.partition(",")
        if version != "v1":
            continue
        try:
            found.append(base64.b64decode(encoded, validate=True))
        except binascii.Error:
            raise SignatureInvalid("malformed v1 signature (bad base64)") from None
    if not found:
        raise SignatureInvalid("no v1 signature in webhook-signature header")
    return found


def verify(
    secrets: Sequence[str],
    msg_id: str | None,
    timestamp: str | None,
    signature_header: str | None,
    body: bytes,
    now: float,
) -> str:
    """Accept the raw body only if any active secret signed it recently (rotation, no replay);
    the secret that signed it is returned, so the caller can record which one it was."""
    if not msg_id:
        raise SignatureInvalid("missing webhook-id header")
    if not timestamp:
        raise SignatureInvalid("missing webhook-timestamp header")
    if not signature_header:
        raise SignatureInvalid("missing webhook-signature header")
    if not _TIMESTAMP.fullmatch(timestamp):
        raise SignatureInvalid("webhook-timestamp is not an integer number of seconds")
    if abs(now - int(timestamp)) > TOLERANCE_S:
        raise SignatureInvalid("timestamp outside tolerance")
    candidates = _candidates(signature_header)
    content = f"{msg_id}.{timestamp}.".encode() + body
    for secret in secrets:
        if (key := _key(secret)) is None:
            continue
        expected = hmac.new(key, content, hashlib.sha256).digest()
        if any(hmac.compare_digest(expected, candidate) for candidate in candidates):
            return secret
    raise SignatureInvalid("no matching signature")


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The webhook-signature header FlowForge sends with its own notifications: what
    `verify` (and any Standard Webhooks receiver) accepts for this secret."""
    key = _key(secret)
    if key is None:
        raise ValueError("not a whsec_ secret")
    content = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
