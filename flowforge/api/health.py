"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import hmac
import json

from flask import Blueprint, Flask, Response, current_app, jsonify, request

from flowforge.api.auth import requires
from flowforge.api.pool import connection
from flowforge.api.problems import Problem
from flowforge.domain.roles import Access
from flowforge.observe import metrics
from flowforge.store import gauges

bp = Blueprint("health", __name__)

# The routes whose answers are counted (flowforge_webhooks_*, flowforge_resumes_total).
WEBHOOK_ENDPOINT = "hooks.receive"
RESUME_ENDPOINT = "resume.resume"


@bp.get("/healthz")
@requires(Access.PUBLIC)
def healthz() -> Response:
    """The process answers: nothing else is checked, so a database outage never kills it."""
    return jsonify({"status": "ok"})


@bp.get("/readyz")
@requires(Access.PUBLIC)
def readyz() -> Response:
    """Ready when the database answers (a 503 problem otherwise)."""
    with connection() as conn:
        conn.execute("SELECT 1")
    return jsonify({"status": "ready"})


@bp.get("/metrics")
@requires(Access.PUBLIC)
def prometheus() -> Response:
    """This server's counters and the cluster-wide gauges read from PostgreSQL, in
    Prometheus text format; only to the bearer of FLOWFORGE_METRICS_TOKEN when it is set
    (the gauges name workflows and hosts, and each scrape costs queries)."""
    _check_metrics_token()
    with connection() as conn:
        text = gauges.render(conn)
    return Response(text, content_type=metrics.CONTENT_TYPE)


def _check_metrics_token() -> None:
    """Refuse (401) a scrape without the configured token, in constant time."""
    expected = current_app.extensions["flowforge.settings"].metrics_token
    if expected is None:
        return
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    genuine = hmac.compare_digest(presented.strip().encode(), expected.encode())
    if scheme.lower() != "bearer" or not genuine:
        raise Problem(
            401,
            "Unauthorized",
            "send Authorization: Bearer <FLOWFORGE_METRICS_TOKEN>",
            headers={"WWW-Authenticate": 'Bearer realm="flowforge-metrics"'},
        )


def install(app: Flask) -> None:
    """Count every answer of the webhook and resume routes, refusals by reason. One hook
    at the end of each request sees every answer, the error handlers' included, and a path
    its converter refused (a malformed workflow key is a 404 with no endpoint)."""

    @app.after_request
    def _count(response: Response) -> Response:
        endpoint = request.endpoint
        if endpoint is None and request.method == "POST":
            path = request.path
            if path.startswith("/hooks/resume/"):
                endpoint = RESUME_ENDPOINT
            elif path.startswith("/hooks/"):
                endpoint = WEBHOOK_ENDPOINT
        if endpoint == WEBHOOK_ENDPOINT:
            _count_webhook(response)
        elif endpoint == RESUME_ENDPOINT:
            _count_resume(response)
        return response


def _problem_type(response: Response) -> str | None:
    try:
        return json.loads(response.get_data()).get("type")
    except (ValueError, AttributeError):
        return None


def _count_webhook(response: Response) -> None:
    status = response.status_code
    if status == 202:
        replayed = response.headers.get("Idempotent-Replayed") == "true"
        (metrics.REPLAYED if replayed else metrics.ACCEPTED).inc()
        return
    # Only a 429 has two reasons; its problem document tells which.
    reason = metrics.refusal_reason(status, _problem_type(response) if status == 429 else None)
    (metrics.REFUSED.get(reason) or metrics.REFUSED[metrics.OTHER_REFUSAL]).inc()


def _count_resume(response: Response) -> None:
    status = response.status_code
    if status == 202:
        outcome = "accepted"
    elif status == 200:
        outcome = "replayed"
    else:
        outcome = metrics.refusal_reason(status)
    child = metrics.RESUMED.get(outcome)
    (child or metrics.RESUMED[metrics.OTHER_REFUSAL]).inc()
