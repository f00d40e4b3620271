"""Signing in to the console with an API key, and what every page checks first.

The cookie holds a random session token (its SHA-256 is the console_sessions row); it
is HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it) and
Secure whenever the request came over TLS, as gunicorn decides it: X-Forwarded-Proto is
believed only from --forwarded-allow-ips (127.0.0.1 by default, the nginx of
docs/nginx/). Every form carries the session's CSRF token and every POST is refused (403)
without it; the sign-in form, which has no session yet, uses a double-submit cookie.
"""

from __future__ import annotations

import functools
import hmac
import secrets
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from flask import g, request
from werkzeug.wrappers import Response

from flowforge.api.auth import check_role
from flowforge.api.pool import connection
from flowforge.domain.roles import Access
from flowforge.errors import Forbidden
from flowforge.store import sessions
from flowforge.store.apikeys import ApiKey

P = ParamSpec("P")
R = TypeVar("R")

COOKIE = "ff_console"
SIGNIN_COOKIE = "ff_console_signin"  # the sign-in form's own CSRF token (double submit)
COOKIE_PATH = "/ui/"


class SignInNeeded(Exception):
    """No live session: the page redirects to the sign-in form."""


def set_cookie(response: Response, name: str, value: str, max_age: int | None) -> None:
    """A console cookie: HttpOnly, SameSite=Strict, Secure over TLS, only under /ui/."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=COOKIE_PATH,
        secure=request.is_secure,
        httponly=True,
        samesite="Strict",
    )


def clear_cookie(response: Response, name: str) -> None:
    """Drop a console cookie."""
    response.delete_cookie(
        name, path=COOKIE_PATH, secure=request.is_secure, httponly=True, samesite="Strict"
    )


def new_signin_token() -> str:
    """The token of one sign-in form (also set as SIGNIN_COOKIE)."""
    return secrets.token_urlsafe(32)


def same_token(presented: str | None, expected: str | None) -> bool:
    """Constant-time comparison of two CSRF tokens; a missing one never matches."""
    if not presented or not expected:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


def signed_in(view: Callable[P, R]) -> Callable[P, R]:
    """Find the session (or send the browser to sign in); on POST, check the CSRF token
    before the view runs. The view finds the key in `g.api_key`, as the API's views do."""

    @functools.wraps(view)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        token = request.cookies.get(COOKIE)
        found = None
        if token:
            with connection() as conn:
                found = sessions.find(conn, token)
        if found is None:
            if request.method == "POST":
                raise Forbidden("sign in to the console first")
            raise SignInNeeded
        if request.method == "POST" and not same_token(request.form.get("csrf"), found.csrf_token):
            raise Forbidden("the form's CSRF token is missing or wrong")
        g.api_key = found.key
        g.console_session = found
        check_role(wrapped, found.key)
        return view(*args, **kwargs)

    return wrapped


def may(workflow: str | None, *, write: bool, access: Access | None = None) -> bool:
    """Whether the signed-in key may read (or act on) this workflow and, when given, has
    the access of the action a page would offer (a page hides what the role may not do;
    the action's own route refuses it anyway)."""
    key: ApiKey = g.api_key
    if access is not None and not key.may(access):
        return False
    return key.allows(workflow, write=write)


def require(workflow: str | None, *, write: bool) -> ApiKey:
    """The signed-in key, if it may read (or act on) this workflow; else 403."""
    if not may(workflow, write=write):
        what = "act on" if write else "read"
        raise Forbidden(f"this API key may not {what} this workflow")
    key: ApiKey = g.api_key
    return key
