"""The console's notifications page (docs/contract.md#notifications): every endpoint with
its newest messages (delivery history), and enabling or disabling one. Installed on the
console's blueprint by `install`, so this module imports none of views.py."""

from __future__ import annotations

from flask import Blueprint, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from flowforge.api.auth import requires
from flowforge.api.console import operate
from flowforge.api.console.session import may, signed_in
from flowforge.api.pool import connection
from flowforge.domain.roles import Access
from flowforge.errors import Forbidden
from flowforge.store import notifications

# Messages shown per endpoint on the page (the API's endpoint shows notifications.HISTORY).
SHOWN = 10


def _admin(write: bool) -> None:
    """As the API: notifications cross workflows, so a key for every workflow."""
    if g.api_key.workflows is not None or not may(None, write=write):
        raise Forbidden("notification endpoints need a key for every workflow")


@signed_in
@requires(Access.READ)
def page() -> str:
    """Every endpoint and its newest messages."""
    _admin(write=False)
    with connection() as conn:
        endpoints = [
            notifications.get(conn, found["name"], deliveries=SHOWN)
            for found in notifications.list_endpoints(conn)
        ]
    return render_template(
        "notifications.html",
        endpoints=endpoints,
        may_switch=may(None, write=True, access=Access.ADMINISTER),
        switched=request.args.get("switched"),
        csrf=str(g.console_session.csrf_token),
    )


@signed_in
@requires(Access.ADMINISTER)
def switch() -> BaseResponse:
    """Enable or disable one endpoint (form fields `name` and `to`)."""
    _admin(write=True)
    name, to = request.form.get("name", ""), request.form.get("to", "")
    with connection() as conn:
        operate.switch_notification(conn, name, enable=to == "enable")
    return redirect(url_for("console.notifications", switched=name), 303)


def install(bp: Blueprint) -> None:
    """Add the page's routes to the console's blueprint."""
    bp.add_url_rule("/notifications", "notifications", page, methods=["GET"])
    bp.add_url_rule("/notifications/switch", "switch_notification", switch, methods=["POST"])
