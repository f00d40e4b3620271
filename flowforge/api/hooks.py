"""POST /hooks/{key}: the webhook intake."""

from __future__ import annotations

import logging
import time

import psycopg
from flask import Blueprint, Response, current_app, jsonify, request

from flowforge import flowcontrol, intake, signatures
from flowforge.api.bodies import parse_json, read_body
from flowforge.api.pool import connection
from flowforge.api.problems import Problem
from flowforge.errors import Conflict
from flowforge.model import ExecutionStatus

logger = logging.getLogger(__name__)

bp = Blueprint("hooks", __name__)
TARGETS = intake.Targets()

MAX_IDEMPOTENCY_KEY = 255


def _idempotency_key(target: intake.Target) -> str | None:
    """The identity of this webhook. For a signed workflow it is the signed `webhook-id`
    alone: an `Idempotency-Key` header is not covered by the signature, so anyone who saw
    one signed request could otherwise replay it as a new execution by adding one. For
    auth "none" nothing is signed, and the sender's `Idempotency-Key` (else `webhook-id`)
    is used."""
    if target.webhook_auth == "signature":
        key = request.headers.get("webhook-id")
    else:
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


def _signed_by(target: intake.Target, raw: bytes) -> int | None:
    """The id of the secret that signed this webhook (None for auth "none")."""
    if target.webhook_auth != "signature":
        return None
    ids: dict[str, int] = {}
    for secret_id, secret in target.secrets:
        ids.setdefault(secret, secret_id)
    headers = request.headers
    try:
        signed_with = signatures.verify(
            list(ids),
            headers.get("webhook-id"),
            headers.get("webhook-timestamp"),
            headers.get("webhook-signature"),
            raw,
            time.time(),
        )
    except signatures.SignatureInvalid as exc:
        if ids:
            raise
        # No active secret: nothing can pass. Say so, and what is wrong with the headers.
        raise signatures.SignatureInvalid(
            "this workflow has no active signing secret: create one (flowforge secret "
            f"create, or POST .../webhook-secrets) and sign with it; also: {exc}"
        ) from None
    return ids[signed_with]


def _accept(conn: psycopg.Connection, key: str, raw: bytes) -> intake.Accepted:
    """Authenticate against the cached target, then accept; look again once when the cache
    is behind (a new secret, a new version, a revoked secret)."""
    for attempt in range(2):
        encryption_key = current_app.extensions["flowforge.settings"].encryption_key
        target = TARGETS.get(conn, key, encryption_key, fresh=attempt > 0)
        try:
            secret_id = _signed_by(target, raw)
        except signatures.SignatureInvalid as exc:
            if attempt == 0:
                continue
            logger.info("webhook refused", extra={"workflow": key, "reason": str(exc)})
            raise
        try:
            parse_json(raw)  # validates: 400 for what jsonb would refuse
            return intake.accept(conn, target, raw, _idempotency_key(target), secret_id)
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
    # The line that ties an access line (same request_id) to the execution it started.
    logger.info(
        "webhook accepted",
        extra={
            "workflow": key,
            "execution_id": accepted.execution_id,
            "replayed": accepted.replayed,
        },
    )
    headers = {"Location": f"/api/v1/executions/{accepted.execution_id}"}
    if accepted.replayed:
        headers["Idempotent-Replayed"] = "true"
    body = {"execution_id": accepted.execution_id, "status": ExecutionStatus.QUEUED.value}
    return jsonify(body), 202, headers
