"""POST /hooks/{key}: the webhook intake."""

from __future__ import annotations

import logging
import time

from flask import Blueprint, Response, current_app, jsonify, request

from flowforge import intake, signatures, workflows
from flowforge.api.bodies import parse_json, read_body
from flowforge.api.pool import connection
from flowforge.api.problems import Problem

logger = logging.getLogger(__name__)

bp = Blueprint("hooks", __name__)

MAX_IDEMPOTENCY_KEY = 255


def _idempotency_key() -> str | None:
    key = request.headers.get("Idempotency-Key") or request.headers.get("webhook-id")
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY or not key.isprintable():
        raise Problem(
            400,
            "Invalid idempotency key",
            f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} printable characters",
        )
    return key


@bp.post("/hooks/<key>")
def receive(key: str) -> tuple[Response, int, dict[str, str]]:
    """Accept an event as a durable execution of the workflow's newest version."""
    if not workflows.KEY_PATTERN.match(key):
        raise Problem(404, "Not found", f"no workflow {key!r}")
    limiter = current_app.extensions.get("flowforge.webhook_limit")
    if limiter is not None and (wait := limiter.retry_after(key)) is not None:
        raise Problem(
            429,
            "Too many requests",
            f"webhooks for {key!r} exceed FLOWFORGE_WEBHOOK_RATE; retry later",
            headers={"Retry-After": str(wait)},
        )
    if request.query_string:
        raise Problem(
            400,
            "Query string not accepted",
            "webhook URLs take no query parameters; put data in the JSON body",
        )
    idempotency_key = _idempotency_key()
    raw = read_body()
    # One pipelined transaction: the version lookup travels with BEGIN, the insert with
    # COMMIT — two round trips and a single commit per accepted webhook.
    with connection() as conn, conn.pipeline(), conn.transaction():
        target = intake.find_target(conn, key)
        if target.webhook_auth == "signature":
            try:
                signatures.verify(
                    target.secrets,
                    request.headers.get("webhook-id"),
                    request.headers.get("webhook-timestamp"),
                    request.headers.get("webhook-signature"),
                    raw,
                    time.time(),
                )
            except signatures.SignatureInvalid as exc:
                logger.info("webhook refused", extra={"workflow": key, "reason": str(exc)})
                raise Problem(401, "Invalid signature", str(exc)) from None
        payload = parse_json(raw)
        accepted = intake.accept(conn, target, raw, payload, idempotency_key)
    headers = {"Location": f"/api/v1/executions/{accepted.execution_id}"}
    if accepted.replayed:
        headers["Idempotent-Replayed"] = "true"
    body = {"execution_id": accepted.execution_id, "status": "queued"}
    return jsonify(body), 202, headers
