"""POST /hooks/resume/<token>: the resume URL of a wait step (docs/contract.md#wait).

The same body rules as webhooks (flowforge/api/bodies.py): identity-encoded JSON within
FLOWFORGE_MAX_BODY_BYTES, no query string. The token is checked before anything is read
from the database, and every token that is not genuine is the same 404.
"""

from __future__ import annotations

import logging
import time

from flask import Blueprint, Response, current_app, jsonify, request

from flowforge.api.auth import requires
from flowforge.api.bodies import parse_json, read_body
from flowforge.api.pool import connection
from flowforge.domain.roles import Access
from flowforge.errors import InvalidParameter, NotFound
from flowforge.trust import resume_tokens, signatures
from flowforge.usecases import resumes

logger = logging.getLogger(__name__)

bp = Blueprint("resume", __name__)


def _check_signature(secrets: list[str]) -> None:
    """Standard Webhooks headers signed with one of the workflow's active secrets."""
    if not secrets:
        raise signatures.SignatureInvalid(
            "this wait takes signed resumes and its workflow has no active signing secret"
        )
    signatures.verify(
        secrets,
        request.headers.get("webhook-id"),
        request.headers.get("webhook-timestamp"),
        request.headers.get("webhook-signature"),
        request.get_data(cache=True),
        time.time(),
    )


@bp.post("/hooks/resume/<token>")
@requires(Access.PUBLIC)
def resume(token: str) -> tuple[Response, int, dict[str, str]]:
    """Succeed the wait step the token names, with the JSON body as its output."""
    settings = current_app.extensions["flowforge.settings"]
    if settings.resume_key is None:
        # Without the key no token is genuine here. The same 404 as for a forged token
        # (a deployment without wait steps needs no key), and a word for the operator
        # when the token looks like one a worker made.
        if token.startswith(resume_tokens.PREFIX):
            logger.error("a resume was refused: FLOWFORGE_RESUME_KEY is not set on this API")
        raise NotFound("no such resume URL")
    if request.query_string:
        raise InvalidParameter(
            "Query string not accepted",
            "resume URLs take no query parameters; put data in the JSON body",
        )
    raw = read_body()
    body = parse_json(raw)
    # Gone (410), Conflict (409), NotFound (404) and SignatureInvalid (401) are client
    # errors: the error tree answers them.
    with connection() as conn:
        done = resumes.resume(
            conn,
            settings.resume_key,
            token,
            raw,
            body,
            check_signature=_check_signature,
            encryption_key=settings.encryption_key,
        )
    answer = {
        "execution_id": done.execution_id,
        "step": done.step_id,
        "status": "kept" if done.kept else "resumed",
    }
    if done.replayed:
        return jsonify(answer), 200, {"Idempotent-Replayed": "true"}
    return jsonify(answer), 202, {}
