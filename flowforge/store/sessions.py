"""Console sign-in sessions: a random cookie token, stored only as its SHA-256, bound to
the API key that signed in; the key's revocation ends the session at its next request."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import psycopg

from flowforge.store.apikeys import ApiKey, from_row

# How long a console session lasts after sign-in; it does not slide.
SESSION_TTL_S = 12 * 3600

CREATE_SESSION = """
INSERT INTO console_sessions (token_hash, api_key_id, csrf_token, expires_at)
VALUES (%(token_hash)s, %(api_key_id)s, %(csrf_token)s,
        now() + make_interval(secs => %(ttl_s)s))
"""
# The session and its key, only while the session has not expired and the key is not
# revoked: revocation needs no session cleanup to take effect.
FIND_SESSION = """
SELECT k.id, k.name, k.workflows, k.role, k.publish_secrets, s.csrf_token
FROM console_sessions s JOIN api_keys k ON k.id = s.api_key_id
WHERE s.token_hash = %(token_hash)s AND s.expires_at > now() AND k.revoked_at IS NULL
"""
END_SESSION = "DELETE FROM console_sessions WHERE token_hash = %(token_hash)s"
# Expired sessions, a bounded batch at each sign-in, so the table stays as small as the
# number of people signed in.
PURGE_EXPIRED = """
DELETE FROM console_sessions WHERE token_hash IN (
    SELECT token_hash FROM console_sessions WHERE expires_at < now() LIMIT 100)
"""


@dataclass(frozen=True)
class Session:
    """A signed-in console session: the key it acts as and the CSRF token of its forms."""

    key: ApiKey
    csrf_token: str


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def start(conn: psycopg.Connection, key: ApiKey) -> str:
    """Open a session for a key that just authenticated; the token exists only in the
    return value (the cookie)."""
    token = secrets.token_urlsafe(32)
    conn.execute(PURGE_EXPIRED)
    conn.execute(
        CREATE_SESSION,
        {
            "token_hash": _hash(token),
            "api_key_id": key.id,
            "csrf_token": secrets.token_urlsafe(32),
            "ttl_s": SESSION_TTL_S,
        },
    )
    return token


def find(conn: psycopg.Connection, token: str) -> Session | None:
    """The live session a cookie token stands for, or None."""
    row = conn.execute(FIND_SESSION, {"token_hash": _hash(token)}).fetchone()
    if row is None:
        return None
    *key, csrf_token = row
    return Session(from_row(tuple(key)), csrf_token)


def end(conn: psycopg.Connection, token: str) -> None:
    """Sign out: the cookie's token no longer opens anything."""
    conn.execute(END_SESSION, {"token_hash": _hash(token)})
