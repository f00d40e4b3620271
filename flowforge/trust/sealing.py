"""Webhook signing secrets at rest: AES-256-GCM under a key that never enters PostgreSQL.

A signing secret is all it takes to forge webhooks, so the database holds it only sealed.
The key lives in the environment (`FLOWFORGE_ENCRYPTION_KEY`) or in the systemd
credential `$CREDENTIALS_DIRECTORY/encryption_key`: 32 random bytes, base64url-encoded
(padding optional), made by `python -m flowforge.trust.sealing`. A dump without that key is
useless for forging. The associated data names the row (workflow id and secret id), so a
sealed value copied into another row, or to another workflow, does not open.

Sealed layout: one version byte (1), a 12-byte random nonce, then ciphertext and tag.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import sys

import psycopg
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from flowforge.errors import Unavailable

logger = logging.getLogger(__name__)

KEY_BYTES = 32
_VERSION = b"\x01"
_NONCE_BYTES = 12

# Clear secrets written before migration 0004, locked so two sealing runs cannot race.
CLEAR_SECRETS = """
SELECT id, workflow_id, secret FROM webhook_secrets WHERE secret IS NOT NULL ORDER BY id
FOR UPDATE
"""
# Replaces the clear value by its sealed form in the same row version.
SEAL_ROW = "UPDATE webhook_secrets SET sealed = %(sealed)s, secret = NULL WHERE id = %(id)s"


class EncryptionKeyMissing(Unavailable):
    """FLOWFORGE_ENCRYPTION_KEY (or the systemd credential encryption_key) is not set, so
    webhook signing secrets can be neither stored nor read."""

    # The operator's to fix, not the caller's: no Retry-After, it will not pass by itself.
    title = "Encryption key missing"
    detail = "signing secrets are unavailable: this server has no FLOWFORGE_ENCRYPTION_KEY"
    retry_after = None


class SecretUnreadable(Unavailable):
    """A sealed signing secret does not open with this key: the key is not the one it was
    sealed with, or the row was altered or copied from another row."""

    title = "Signing secret unreadable"
    detail = "a signing secret of this workflow cannot be decrypted; the operator was told"
    retry_after = None


def new_key() -> str:
    """A fresh encryption key in the format FLOWFORGE_ENCRYPTION_KEY expects."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode("ascii").rstrip("=")


def parse_key(text: str) -> bytes:
    """Decode a base64url key (padding optional); ValueError names what is wrong, never the
    value itself."""
    stripped = text.strip()
    try:
        key = base64.urlsafe_b64decode(stripped + "=" * (-len(stripped) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("is not base64url") from None
    if len(key) != KEY_BYTES:
        raise ValueError(f"must decode to {KEY_BYTES} bytes, not {len(key)}")
    return key


def _associated_data(workflow_id: int, secret_id: int, table: str) -> bytes:
    return f"flowforge:{table}:{workflow_id}:{secret_id}".encode()


def seal(
    key: bytes | None,
    secret: str,
    workflow_id: int,
    secret_id: int,
    table: str = "webhook_secrets",
) -> bytes:
    """Encrypt one signing secret for the row (workflow_id, secret_id) of `table`
    (source_secrets rows name their source's id): a row copied elsewhere does not open."""
    if key is None:
        raise EncryptionKeyMissing
    nonce = os.urandom(_NONCE_BYTES)
    ciphertext = AESGCM(key).encrypt(
        nonce, secret.encode(), _associated_data(workflow_id, secret_id, table)
    )
    return _VERSION + nonce + ciphertext


def unseal(
    key: bytes | None,
    sealed: bytes,
    workflow_id: int,
    secret_id: int,
    table: str = "webhook_secrets",
) -> str:
    """Decrypt the signing secret of row (workflow_id, secret_id) of `table`."""
    if key is None:
        raise EncryptionKeyMissing
    sealed = bytes(sealed)
    if sealed[:1] != _VERSION:
        raise SecretUnreadable(f"webhook secret {secret_id} has an unknown sealed format")
    nonce, ciphertext = sealed[1 : 1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES :]
    try:
        plain = AESGCM(key).decrypt(
            nonce, ciphertext, _associated_data(workflow_id, secret_id, table)
        )
    except InvalidTag:
        raise SecretUnreadable(
            f"webhook secret {secret_id} of workflow {workflow_id} does not open with "
            "FLOWFORGE_ENCRYPTION_KEY (another key, or an altered or copied row)"
        ) from None
    return plain.decode()


def seal_clear_secrets(conn: psycopg.Connection, key: bytes | None) -> int:
    """Seal every secret still stored in clear (rows from before migration 0004); return
    how many. With clear rows and no key this raises EncryptionKeyMissing and changes
    nothing."""
    with conn.transaction():
        rows = conn.execute(CLEAR_SECRETS).fetchall()
        if rows and key is None:
            raise EncryptionKeyMissing
        for secret_id, workflow_id, secret in rows:
            conn.execute(
                SEAL_ROW, {"id": secret_id, "sealed": seal(key, secret, workflow_id, secret_id)}
            )
    if rows:
        # The clear values live on in dead row versions until the table is rewritten.
        conn.execute("VACUUM FULL webhook_secrets")
        logger.info("sealed %d webhook signing secret(s) stored in clear", len(rows))
    return len(rows)


if __name__ == "__main__":
    # python -m flowforge.trust.sealing: print a new key for FLOWFORGE_ENCRYPTION_KEY.
    print(new_key())
    sys.exit(0)
