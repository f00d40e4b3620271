"""Bearer API keys for /api/v1: who is calling, and whether the key's scope allows it."""

from __future__ import annotations

from flask import g, request

from flowforge import apikeys
from flowforge.api.pool import connection
from flowforge.api.problems import Problem


def require_key() -> apikeys.ApiKey:
    """Authenticate the request's bearer key or answer 401."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(
            401,
            "Unauthorized",
            "send Authorization: Bearer <api key>",
            headers={"WWW-Authenticate": 'Bearer realm="flowforge"'},
        )
    with connection() as conn:
        key = apikeys.authenticate(conn, token.strip())
    if key is None:
        raise Problem(
            401,
            "Unauthorized",
            "the API key is not valid or was revoked",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    g.api_key = key
    return key


def authorize(workflow: str | None, *, write: bool) -> apikeys.ApiKey:
    """Authenticate, then check the key may read (or write) this workflow."""
    key = require_key()
    if not key.allows(workflow, write=write):
        what = "write" if write else "read"
        raise Problem(403, "Forbidden", f"this API key may not {what} this workflow")
    return key
