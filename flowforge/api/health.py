"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from flowforge import metrics
from flowforge.api.pool import connection

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    """The process answers: nothing else is checked, so a database outage never kills it."""
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    """Ready when the database answers (a 503 problem otherwise)."""
    with connection() as conn:
        conn.execute("SELECT 1")
    return jsonify({"status": "ready"})


@bp.get("/metrics")
def prometheus() -> Response:
    """Cluster-wide gauges read from PostgreSQL, in Prometheus text format."""
    with connection() as conn:
        text = metrics.render(conn)
    return Response(text, mimetype="text/plain; version=0.0.4")
