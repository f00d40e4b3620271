"""Bearer API keys for /api/v1: who is calling, and whether the key's scope allows it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from flask import g, request

from flowforge.api.pool import connection
from flowforge.api.problems import Problem
from flowforge.errors import Forbidden
from flowforge.store import apikeys

P = ParamSpec("P")
R = TypeVar("R")


def key_required(view: Callable[P, R]) -> Callable[P, R]:
    """Authenticate the bearer key (or answer 401) before the view runs; the view and
    `authorize` find it in `g.api_key`, so a request is authenticated once."""

    @functools.wraps(view)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        g.api_key = _authenticate()
        return view(*args, **kwargs)

    return wrapped


def _authenticate() -> apikeys.ApiKey:
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
    return key


def authorize(workflow: str | None, *, write: bool) -> apikeys.ApiKey:
    """Check the request's key (see key_required) may read (or write) this workflow."""
    key: apikeys.ApiKey = g.api_key
    if not key.allows(workflow, write=write):
        what = "write" if write else "read"
        raise Forbidden(f"this API key may not {what} this workflow")
    return key
