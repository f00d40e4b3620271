"""Signing webhooks the way a Standard Webhooks sender does, independently of FlowForge."""

from __future__ import annotations

import base64
import hashlib
import hmac


def sign(secret: str, msg_id: str, timestamp: int | str, body: bytes) -> str:
    """A `webhook-signature` value: v1,base64(HMAC-SHA256(id.timestamp.body))."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()
