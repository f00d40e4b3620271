"""POST /hooks/{key}: the webhook intake."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
from flask import Blueprint, Response, current_app, jsonify, request

from flowforge.api.auth import requires
from flowforge.api.bodies import parse_json, read_body
from flowforge.api.pool import connection
from flowforge.api.problems import Problem
from flowforge.domain import inputschema
from flowforge.domain.model import MAX_IDEMPOTENCY_KEY, ExecutionStatus
from flowforge.domain.roles import Access
from flowforge.errors import Conflict, InvalidParameter, NotFound
from flowforge.observe import metrics, tracing
from flowforge.store import flowcontrol, sources
from flowforge.trust import presets, signatures
from flowforge.usecases import events, grouping, intake, routing

logger = logging.getLogger(__name__)

bp = Blueprint("hooks", __name__)

STATUS_NOW = "SELECT status FROM executions WHERE id = %(id)s"
# The 202's status of an event recorded in a debounce or batch group.
GROUPED = "grouped"


def _idempotency_key(verified: presets.Verified | None) -> str | None:
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
        raise InvalidParameter(
            "Invalid idempotency key",
            f"the webhook's identity must be 1-{MAX_IDEMPOTENCY_KEY} printable characters",
        )
    return key


def _verified(
    auth: str, secrets: tuple[tuple[int, str], ...], raw: bytes, owner: str = "workflow"
) -> presets.Verified | None:
    """The proof that this webhook comes from a secret holder (None for auth "none")."""
    if auth not in presets.SIGNED:
        return None
    values = [secret for _, secret in secrets]
    try:
        return presets.verify(auth, values, request.headers, raw, time.time())
    except signatures.SignatureInvalid as exc:
        if values:
            raise
        # No active secret: nothing can pass. Say so, and what is wrong with the headers.
        raise signatures.SignatureInvalid(
            f"this {owner} has no active signing secret: create one (flowforge secret "
            f"create, or POST .../webhook-secrets) and sign with it; also: {exc}"
        ) from None


def _handshake(verified: presets.Verified | None) -> dict[str, str] | None:
    """The 200 answer to a provider's signed handshake, which starts nothing: Slack's
    url_verification (its challenge echoed) and GitHub's ping."""
    if verified is None:
        return None
    if verified.challenge is not None:
        return {"challenge": verified.challenge}
    if verified.ping:
        return {"ping": "ok"}
    return None


def _secret_id(
    secrets: tuple[tuple[int, str], ...], verified: presets.Verified | None
) -> int | None:
    """The id of the secret that signed the webhook (the oldest of equal values)."""
    if verified is None:
        return None
    return next(sid for sid, value in secrets if value == verified.secret)


def _accept(
    conn: psycopg.Connection, key: str, raw: bytes, traceparent: str | None
) -> intake.Accepted | dict[str, str]:
    """Authenticate against the cached target, then accept; look again once when the cache
    is behind (a new version, a revoked secret: always; a signature no cached secret
    verifies: at most once per intake.RECHECK_INTERVAL_S, so forgeries cost no reads). A
    signed Slack url_verification or GitHub ping starts nothing: its 200 answer is
    returned instead (_handshake)."""
    encryption_key = current_app.extensions["flowforge.settings"].encryption_key
    target = intake.TARGETS.get(conn, key, encryption_key)
    for attempt in range(2):
        try:
            verified = _verified(target.webhook_auth, target.secrets, raw)
        except signatures.SignatureInvalid as exc:
            fresher = intake.TARGETS.recheck(conn, key, encryption_key) if attempt == 0 else None
            if fresher is None:
                logger.info("webhook refused", extra={"workflow": key, "reason": str(exc)})
                raise
            target = fresher
            continue
        if (handshake := _handshake(verified)) is not None:
            return handshake
        try:
            body = parse_json(raw)  # validates: 400 for what jsonb would refuse
            if target.input_checker is not None:
                try:
                    inputschema.check(target.input_checker, body)  # 413/422, nothing written
                except (inputschema.InputInvalid, inputschema.InputTooLarge):
                    # The cached schema may be an older version's, which only the
                    # publishing process forgets: re-read, within the same throttle as
                    # forged signatures, before refusing (docs/reference/input-schema.md).
                    fresher = (
                        intake.TARGETS.recheck(conn, key, encryption_key) if attempt == 0 else None
                    )
                    if fresher is None or fresher.version_id == target.version_id:
                        raise
                    target = fresher
                    continue
            identity = _idempotency_key(verified)
            secret_id = _secret_id(target.secrets, verified)
            if grouping.is_grouped(target.definition):
                return grouping.record(conn, target, raw, identity, secret_id)
            accepted = intake.accept(
                conn, target, raw, identity, secret_id, traceparent, headers=dict(request.headers)
            )
            if target.definition.emits is not None and verified is not None:
                # docs/contract.md#events: a verified delivery emits its workflow's event.
                events.emit(conn, key, target.definition, accepted.execution_id, body)
            return accepted
        except intake.StaleTarget:
            target = intake.TARGETS.get(conn, key, encryption_key, fresh=True)
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


def _route(
    conn: psycopg.Connection, source: sources.Source, raw: bytes
) -> tuple[Response, int, dict[str, str]]:
    """An event for a source: verified with the source's secrets, then one execution per
    matching subscription in one transaction (routing.route); looked up afresh once
    when the cached source or a cached workflow target is behind."""
    encryption_key = current_app.extensions["flowforge.settings"].encryption_key
    for attempt in range(2):
        try:
            verified = _verified(source.auth, source.secrets, raw, "source")
        except signatures.SignatureInvalid as exc:
            fresher = (
                routing.SOURCES.recheck(conn, source, encryption_key) if attempt == 0 else None
            )
            if fresher is None:
                logger.info("webhook refused", extra={"source": source.name, "reason": str(exc)})
                raise
            source = fresher
            continue
        if (handshake := _handshake(verified)) is not None:
            routing.record_handshake(conn, source, raw, _idempotency_key(verified))
            return jsonify(handshake), 200, {}
        body = parse_json(raw)
        headers = {name.lower(): value for name, value in request.headers.items()}
        try:
            routed = routing.route(
                conn,
                routing.SOURCES,
                source,
                raw,
                body,
                headers,
                _idempotency_key(verified),
                _secret_id(source.secrets, verified),
                fresh=attempt > 0,
            )
        except sources.StaleSource:
            fresh = routing.SOURCES.load(conn, source.name, encryption_key)
            if fresh is None:
                raise NotFound(f"source {source.name!r} does not exist") from None
            source = fresh
            continue
        except flowcontrol.QueueFull as exc:
            raise Problem(
                exc.status, exc.title, exc.detail, headers={"Retry-After": str(exc.retry_after_s)}
            ) from None
        metrics.count_routed(source.name, [r.subscription for r in routed])
        if verified is not None:
            _emit_routed(conn, routed, body)
        answer = {
            "source": source.name,
            "executions": [
                {
                    "subscription": r.subscription,
                    "workflow": r.workflow,
                    "execution_id": r.accepted.execution_id,
                    "replayed": r.accepted.replayed,
                    **({"group": r.accepted.group} if r.accepted.group is not None else {}),
                }
                for r in routed
            ],
        }
        replayed = bool(routed) and all(r.accepted.replayed for r in routed)
        return jsonify(answer), 202, {"Idempotent-Replayed": "true"} if replayed else {}
    raise Conflict(f"source {source.name!r} changed while this event was routed; send it again")


def _emit_routed(conn: psycopg.Connection, routed: list[routing.Routed], body: Any) -> None:
    """docs/contract.md#events: a delivery the source verified emits the event of each
    workflow it started that declares `emits` (the targets are the ones routing just
    read, cached: a workflow without `emits` costs no statement)."""
    for r in routed:
        if r.accepted.group is None:
            target = routing.SOURCES.target(conn, r.workflow, fresh=False)
            if target.definition.emits is not None:
                events.emit(conn, r.workflow, target.definition, r.accepted.execution_id, body)


def _replicate(conn: psycopg.Connection) -> None:
    """With FLOWFORGE_SYNC_INTAKE, no 202 before the webhook's commit is on a synchronous
    standby (docs/howto/several-hosts.md); a replayed key waits too, since its first 202
    may never have been given. Without it: nothing, not even a statement."""
    level = current_app.extensions["flowforge.settings"].sync_intake
    if level:
        intake.replicate(conn, level)


@bp.post("/hooks/<workflow_key(answer='hook'):key>")
@requires(Access.PUBLIC)
def receive(key: str) -> tuple[Response, int, dict[str, str]]:
    """Accept an event as a durable execution of the workflow's newest version."""
    with tracing.intake(request.headers, key) as span:
        return _receive(key, span)


def _receive(key: str, span: tracing.Intake) -> tuple[Response, int, dict[str, str]]:
    limiter = current_app.extensions.get("flowforge.webhook_limit")
    if limiter is not None and (wait := limiter.retry_after(key)) is not None:
        raise Problem(
            429,
            "Too many requests",
            f"webhooks for {key!r} exceed FLOWFORGE_WEBHOOK_RATE; retry later",
            headers={"Retry-After": str(wait)},
        )
    if request.query_string:
        raise InvalidParameter(
            "Query string not accepted",
            "webhook URLs take no query parameters; put data in the JSON body",
        )
    raw = read_body()
    encryption_key = current_app.extensions["flowforge.settings"].encryption_key
    with connection() as conn:
        source = routing.SOURCES.cached(conn, key, encryption_key)
        if source is None:
            try:
                accepted = _accept(conn, key, raw, span.traceparent)
            except NotFound:
                source = routing.SOURCES.load(conn, key, encryption_key)
                if source is None:
                    raise
        if source is not None:
            routed = _route(conn, source, raw)
            _replicate(conn)
            return routed
        if isinstance(accepted, dict):
            return jsonify(accepted), 200, {}
        _replicate(conn)
        status = ExecutionStatus.QUEUED.value
        if accepted.replayed:
            # A redelivery answers where its execution stands now (only replays pay the read).
            row = conn.execute(STATUS_NOW, {"id": accepted.execution_id}).fetchone()
            status = row[0] if row is not None else status
    span.accepted(accepted.execution_id, accepted.replayed)
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
    body: dict[str, Any] = {"execution_id": accepted.execution_id, "status": status}
    if accepted.group is not None:
        # Debounced or batched (grouping.py): recorded against the group's execution,
        # which exists once the group is due; until then the group says where it stands.
        body["status"] = GROUPED
        body["group"] = accepted.group
        headers["Location"] = f"/api/v1/workflows/{key}/groups/{accepted.group['id']}"
    return jsonify(body), 202, headers
