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


# The providers' schemes, each written from the provider's own documentation (the links),
# with the standard library only: never through flowforge.trust.presets.


def stripe_header(secrets: list[str], timestamp: int, body: bytes) -> str:
    """Stripe-Signature (stripe.com/docs/webhooks#verify-manually): t=, then one v1= per
    secret (Stripe sends several while a secret is rolled), hex HMAC-SHA256 of `t.body`
    keyed with the whole whsec_ string."""
    signed = f"{timestamp}.".encode() + body
    parts = [f"t={timestamp}"] + [
        "v1=" + hmac.new(s.encode(), signed, hashlib.sha256).hexdigest() for s in secrets
    ]
    return ",".join(parts)


def github_header(secret: str, body: bytes) -> str:
    """X-Hub-Signature-256 (docs.github.com, Validating webhook deliveries)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def shopify_header(secret: str, body: bytes) -> str:
    """X-Shopify-Hmac-Sha256 (shopify.dev/docs/apps/build/webhooks/subscribe/https)."""
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def slack_header(secret: str, timestamp: int | str, body: bytes) -> str:
    """X-Slack-Signature (api.slack.com/authentication/verifying-requests-from-slack)."""
    basestring = f"v0:{timestamp}:".encode() + body
    return "v0=" + hmac.new(secret.encode(), basestring, hashlib.sha256).hexdigest()


def shopify_reference(secret: str, data: bytes, hmac_header: str) -> bool:
    """Shopify's published Python verifier, as documented (shopify.dev, "Verify the
    webhook"); Shopify ships no Python package for webhooks."""
    digest = hmac.new(secret.encode("utf-8"), data, digestmod=hashlib.sha256).digest()
    computed_hmac = base64.b64encode(digest)
    return hmac.compare_digest(computed_hmac, hmac_header.encode("utf-8"))


def github_reference(secret: str, payload_body: bytes, signature_header: str | None) -> bool:
    """GitHub's published Python verifier (docs.github.com, Validating webhook deliveries,
    "Python example"), returning instead of raising."""
    if not signature_header:
        return False
    hash_object = hmac.new(secret.encode("utf-8"), msg=payload_body, digestmod=hashlib.sha256)
    expected_signature = "sha256=" + hash_object.hexdigest()
    return hmac.compare_digest(expected_signature, signature_header)
