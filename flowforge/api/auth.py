"""Bearer API keys for /api/v1: who is calling, whether the key's role has what the route
declares it needs (docs/contract.md#roles), and whether the key's scope allows the workflow.

Every route declares its access once, with `@requires(Access.X)` between its route
decorator and the view (for the console too); `key_required` and the console's
`signed_in` check the role before the view runs, so a view only checks the workflow. A
route that declares nothing is treated as ADMINISTER (refused to viewers and operators)
and fails tests/integration/test_access_matrix.py until it declares.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from flask import g, request

from flowforge.api.pool import connection
from flowforge.api.problems import Problem
from flowforge.domain.roles import Access
from flowforge.errors import Forbidden, RoleRequired
from flowforge.store import apikeys

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., object])

# Where `requires` writes a view's declared access; functools.wraps copies it outward, so
# the function the app routes to carries it whatever order the decorators are in.
ATTRIBUTE = "flowforge_access"
# Flask's own static-file routes, which serve the console's CSS and scripts to anyone.
BUILT_IN = {"static": Access.PUBLIC, "console.static": Access.PUBLIC}
# What a route that declares nothing needs: the most, so forgetting is never a grant.
UNDECLARED = Access.ADMINISTER


def requires(access: Access) -> Callable[[F], F]:
    """Declare the access a route needs (place it under the route decorator)."""

    def declare(view: F) -> F:
        setattr(view, ATTRIBUTE, access)
        return view

    return declare


def declared(view: Callable[..., object], endpoint: str = "") -> Access | None:
    """The access a view (the one an endpoint routes to) declares, or None."""
    found = getattr(view, ATTRIBUTE, None) or BUILT_IN.get(endpoint)
    return found if isinstance(found, Access) else None


def check_role(view: Callable[..., object], key: apikeys.ApiKey) -> None:
    """Refuse (403, naming the role needed) a key whose role lacks the view's access."""
    needed = declared(view) or UNDECLARED
    if not key.may(needed) and needed.role is not None:
        raise RoleRequired(needed.role.value, key.role.value)


def key_required(view: Callable[P, R]) -> Callable[P, R]:
    """Authenticate the bearer key (or answer 401) before the view runs; the view and
    `authorize` find it in `g.api_key`, so a request is authenticated once."""

    @functools.wraps(view)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        g.api_key = _authenticate()
        check_role(wrapped, g.api_key)
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
