"""POST /hooks/{key}: the webhook intake."""

from __future__ import annotations

import logging
import time

import psycopg
from flask import Blueprint, Response, current_app, jsonify, request

from flowforge import flowcontrol, inputschema, intake, presets, signatures
from flowforge.api.bodies import parse_json, read_body
from flowforge.api.pool import connection
from flowforge.api.problems import Problem
from flowforge.errors import Conflict
from flowforge.model import ExecutionStatus

logger = logging.getLogger(__name__)

bp = Blueprint("hooks", __name__)
TARGETS = intake.Targets()

MAX_IDEMPOTENCY_KEY = 255


def _idempotency_key(target: intake.Target, verified: presets.Verified | None) -> str | None:
    """The identity of this webhook. For a signed workflow it is the provider's delivery id
    (presets.py: `webhook-id`, Stripe's event id, X-GitHub-Delivery, ...) alone: an
    `Idempotency-Key` header is not covered by any signature, so anyone who saw one signed
    request could otherwise replay it as a new execution by adding one. For auth "none"
    nothing is signed, and the sender's `Idempotency-Key` (else `webhook-id`) is used."""
    if verified is not None:
        key = verified.identity
    else:
        key = request.headers.get("Idempotency-Key") or request.headers.get("webhook-id")
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY or not key.isprintable():
        raise Problem(
            400,
            "Invalid idempotency key",
            f"the webhook's identity must be 1-{MAX_IDEMPOTENCY_KEY} printable characters",
        )
    return key


def _verified(target: intake.Target, raw: bytes) -> presets.Verified | None:
    """The proof that this webhook comes from a secret holder (None for auth "none")."""
    if target.webhook_auth not in presets.SIGNED:
        return None
    values = [secret for _, secret in target.secrets]
    try:
        return presets.verify(target.webhook_auth, values, request.headers, raw, time.time())
    except signatures.SignatureInvalid as exc:
        if values:
            raise
        # No active secret: nothing can pass. Say so, and what is wrong with the headers.
        raise signatures.SignatureInvalid(
            "this workflow has no active signing secret: create one (flowforge secret "
            f"create, or POST .../webhook-secrets) and sign with it; also: {exc}"
        ) from None


def _secret_id(target: intake.Target, verified: presets.Verified | None) -> int | None:
    """The id of the secret that signed the webhook (the oldest of equal values)."""
    if verified is None:
        return None
    return next(sid for sid, value in target.secrets if value == verified.secret)


def _accept(conn: psycopg.Connection, key: str, raw: bytes) -> intake.Accepted | str:
    """Authenticate against the cached target, then accept; look again once when the cache
    is behind (a new secret, a new version, a revoked secret). A signed Slack
    url_verification is answered with its challenge (returned as a str) and starts nothing."""
    for attempt in range(2):
        encryption_key = current_app.extensions["flowforge.settings"].encryption_key
        target = TARGETS.get(conn, key, encryption_key, fresh=attempt > 0)
        try:
            verified = _verified(target, raw)
        except signatures.SignatureInvalid as exc:
            if attempt == 0:
                continue
            logger.info("webhook refused", extra={"workflow": key, "reason": str(exc)})
            raise
        if verified is not None and verified.challenge is not None:
            return verified.challenge
        try:
            body = parse_json(raw)  # validates: 400 for what jsonb would refuse
            if target.input_checker is not None:
                inputschema.check(target.input_checker, body)  # 413/422, nothing written
            identity = _idempotency_key(target, verified)
            return intake.accept(conn, target, raw, identity, _secret_id(target, verified))
        except intake.StaleTarget:
            continue
        except flowcontrol.QueueFull as exc:
            # Decided in PostgreSQL: every API process gives the same answer.
            raise Problem(
                exc.status,
                exc.title,
                exc.detail,
                headers={"Retry-After": str(exc.retry_after_s)},
            ) from None
    raise Conflict(f"workflow {key!r} changed while this webhook was accepted; send it again")


@bp.post("/hooks/<workflow_key(answer='hook'):key>")
def receive(key: str) -> tuple[Response, int, dict[str, str]]:
    """Accept an event as a durable execution of the workflow's newest version."""
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
    raw = read_body()
    with connection() as conn:
        accepted = _accept(conn, key, raw)
    if isinstance(accepted, str):
        return jsonify({"challenge": accepted}), 200, {}
    headers = {"Location": f"/api/v1/executions/{accepted.execution_id}"}
    if accepted.replayed:
        headers["Idempotent-Replayed"] = "true"
    body = {"execution_id": accepted.execution_id, "status": ExecutionStatus.QUEUED.value}
    return jsonify(body), 202, headers
