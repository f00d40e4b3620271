"""The console's blueprint and what every page shares: security headers, error pages,
template filters, the session's CSRF token. The pages register on `bp` from their own
modules (views, workflow_pages)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from flask import (
    Blueprint,
    Response,
    g,
    redirect,
    render_template,
    request,
    url_for,
)
from werkzeug.wrappers import Response as BaseResponse

from flowforge.api.console import graph
from flowforge.api.console.session import (
    SignInNeeded,
)
from flowforge.api.problems import Problem
from flowforge.domain.model import (
    TERMINAL_EXECUTION,
)
from flowforge.errors import ClientError

bp = Blueprint(
    "console",
    __name__,
    url_prefix="/ui",
    template_folder="templates",
    static_folder="static",
)
# No other site may frame, script or post into the console; its own files only.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@bp.after_request
def _harden(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


@bp.errorhandler(SignInNeeded)
def _sign_in(_exc: SignInNeeded) -> BaseResponse | tuple[str, int]:
    if request.headers.get("X-Requested-With") == "fetch":
        # The live page's script: a sign-in form is no fragment; it stops polling on 401.
        return render_template(
            "error.html", status=401, title="Unauthorized", detail="sign in again"
        ), 401
    return redirect(url_for("console.signin", next=request.full_path.rstrip("?")), 303)


@bp.errorhandler(Problem)
def _problem_page(exc: Problem) -> tuple[str, int]:
    return render_template("error.html", status=exc.status, title=exc.title, detail=exc.detail), (
        exc.status
    )


@bp.errorhandler(ClientError)
def _client_error_page(exc: ClientError) -> tuple[str, int]:
    return render_template(
        "error.html", status=exc.status, title=exc.title, detail=exc.detail
    ), exc.status


@bp.app_template_filter("pretty")
def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


@bp.app_template_filter("when")
def _when(value: str | datetime | None) -> str:
    if value is None:
        return "—"
    return graph.stamp(value)


def _span(seconds: float) -> str:
    """A length of time as an operator reads it: 180 ms, 4.2 s, 3 min 5 s, 2 h 10 min, 3 d."""
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} d"


@bp.app_template_filter("ago")
def _ago(value: str | datetime | None) -> str:
    """How long ago, from the server's clock: `5 min ago`; the page puts the absolute
    time (the `when` format) in the element's title."""
    if value is None:
        return "—"
    instant = datetime.fromisoformat(value) if isinstance(value, str) else value
    seconds = (datetime.now(UTC) - instant).total_seconds()
    return "just now" if seconds < 1 else f"{_span(seconds)} ago"


@bp.app_template_filter("took")
def _took(row: dict[str, Any]) -> str:
    """How long an execution took from creation to its end, or has run so far (`…`)."""
    start = row["created_at"]
    if row.get("finished_at") and row["status"] in TERMINAL_EXECUTION:
        return _span((row["finished_at"] - start).total_seconds())
    return f"{_span((datetime.now(UTC) - start).total_seconds())} …"


def csrf_token() -> str:
    """The signed-in session's CSRF token, which every form of a page carries."""
    return str(g.console_session.csrf_token)
