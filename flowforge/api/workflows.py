"""Publishing and reading workflows, and managing their webhook signing secrets."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g, jsonify, request

from flowforge.api import drafts
from flowforge.api.auth import authorize, key_required, requires
from flowforge.api.bodies import json_body, supplied_secret
from flowforge.api.pool import connection
from flowforge.domain.roles import Access
from flowforge.errors import InvalidBody, InvalidParameter
from flowforge.store import catalog
from flowforge.store.apikeys import ApiKey
from flowforge.trust import signatures
from flowforge.usecases import grouping, intake, pausing, publishing, reingest

# A supplied secret's length: the providers' are 32-70 characters; shorter is guessable.

bp = Blueprint("workflows", __name__, url_prefix="/api/v1/workflows")


@bp.post("/<workflow_key(answer='publish'):key>/versions")
@key_required
@requires(Access.ADMINISTER)
def publish(key: str) -> tuple[Response, int, dict[str, str]]:
    """Publish the next immutable version of a workflow."""
    api_key = authorize(key, write=True)
    document = json_body()
    definition = drafts.publishable(key, document, api_key)
    with connection() as conn:
        published = publishing.publish(conn, key, document, definition, api_key.id)
    location = f"/api/v1/workflows/{key}/versions/{published['version']}"
    return jsonify(published), 201, {"Location": location}


@bp.get("")
@key_required
@requires(Access.READ)
def list_all() -> Response:
    """Workflows the key may see, each with its newest version."""
    api_key: ApiKey = g.api_key
    with connection() as conn:
        items = catalog.list_workflows(
            conn, list(api_key.workflows) if api_key.workflows is not None else None
        )
    return jsonify({"items": items})


@bp.get("/<workflow_key:key>")
@key_required
@requires(Access.READ)
def show(key: str) -> Response:
    """One workflow and its versions."""
    authorize(key, write=False)
    with connection() as conn:
        detail = catalog.get_workflow(conn, key)
        detail["paused"] = catalog.workflow_pause(conn, key)
        return jsonify(detail)


@bp.post("/<workflow_key:key>/pause")
@key_required
@requires(Access.OPERATE)
def pause(key: str) -> Response:
    """Pause a workflow (docs/contract.md#pause): webhooks are still accepted and queue; nothing of
    it starts or continues until it is resumed."""
    authorize(key, write=True)
    api_key: ApiKey = g.api_key
    with connection() as conn:
        result = pausing.pause_workflow(conn, key, actor=api_key.actor())
        return jsonify({"workflow": key, **result})


@bp.post("/<workflow_key:key>/resume")
@key_required
@requires(Access.OPERATE)
def resume(key: str) -> Response:
    """Resume a workflow: its paused executions in arrival order, then its queues. With
    {"onto": "latest" | N}, its executions that never started a step are re-pinned onto
    that version first (docs/howto/morning-after-an-outage.md)."""
    authorize(key, write=True)
    api_key: ApiKey = g.api_key
    onto = _onto() if request.content_length or request.get_data(cache=True) else None
    with connection() as conn:
        result = pausing.resume_workflow(conn, key, actor=api_key.actor(), onto=onto)
        return jsonify({"workflow": key, **result})


def _onto() -> pausing.Onto:
    """The `onto` of a resume's body: "latest" or a version number."""
    body = json_body()
    if isinstance(body, dict) and set(body) == {"onto"}:
        onto = body["onto"]
        if isinstance(onto, float) and onto.is_integer():
            onto = int(onto)  # 2.0 is the JSON number 2
        if onto == "latest" or (type(onto) is int and 1 <= onto <= pausing.MAX_VERSION):
            return onto
    raise InvalidBody(
        "Invalid resume",
        'send {"onto": "latest"} or {"onto": <a version number>}, or no body',
        errors=[{"path": "$.onto", "message": '"latest" or a version number'}],
    )


@bp.post("/<workflow_key:key>/reingest")
@key_required
@requires(Access.OPERATE)
def reingest_range(key: str) -> Response:
    """Re-ingest archived webhooks of a time range as new executions of the newest version
    (docs/contract.md#reingest), or count them (dry_run); at most reingest.MAX_PER_REQUEST per
    request."""
    authorize(key, write=True)
    api_key: ApiKey = g.api_key
    request_ = reingest.parse(json_body())
    with connection() as conn:
        return jsonify(reingest.reingest(conn, key, request_, api_key.actor()))


@bp.get("/<workflow_key:key>/groups")
@key_required
@requires(Access.READ)
def list_groups(key: str) -> Response:
    """The workflow's debounce or batch groups (docs/contract.md#debounce-batch), newest first:
    `?status=open` for the ones still gathering events."""
    authorize(key, write=False)
    status = request.args.get("status")
    if status is not None and status not in grouping.STATUSES:
        raise InvalidParameter(
            "Invalid status", f"status must be one of {', '.join(grouping.STATUSES)}"
        )
    with connection() as conn:
        catalog.get_workflow(conn, key)  # 404 for an unknown workflow
        return jsonify({"workflow": key, "items": grouping.groups(conn, key, status)})


@bp.get("/<workflow_key:key>/groups/<int:group_id>")
@key_required
@requires(Access.READ)
def show_group(key: str, group_id: int) -> Response:
    """One debounce or batch group with its first events."""
    authorize(key, write=False)
    with connection() as conn:
        return jsonify(grouping.group(conn, key, group_id))


@bp.get("/<workflow_key:key>/versions/<int:version>")
@key_required
@requires(Access.READ)
def show_version(key: str, version: int) -> Response:
    """One immutable version, with its definition."""
    authorize(key, write=False)
    with connection() as conn:
        return jsonify(catalog.get_version(conn, key, version))


@bp.post("/<workflow_key:key>/webhook-secrets")
@key_required
@requires(Access.ADMINISTER)
def create_secret(key: str) -> tuple[Response, int]:
    """Create a signing secret; its value is shown in this answer only. Without a body
    FlowForge makes a Standard Webhooks secret; with `{"value": "..."}` it stores the one
    a provider gave (Stripe, GitHub, Shopify, Slack: docs/contract.md#presets), sealed the same
    way."""
    authorize(key, write=True)
    supplied = supplied_secret()
    encryption_key = current_app.extensions["flowforge.settings"].encryption_key
    with connection() as conn:
        if supplied is not None:
            catalog.check_supplied_secret(conn, key, supplied)
        value = supplied if supplied is not None else signatures.new_secret()
        created = catalog.create_secret(conn, key, value, encryption_key)
        intake.TARGETS.forget(conn, key, encryption_key)
        warning = catalog.unsigned_warning(conn, key)
    if supplied is not None:
        del created["secret"]  # the caller has it; an answer need not carry it again
    if warning:
        created = {**created, "warning": warning}
    return jsonify(created), 201


@bp.get("/<workflow_key:key>/webhook-secrets")
@key_required
@requires(Access.READ)
def list_secrets(key: str) -> Response:
    """The workflow's secrets, without their values."""
    authorize(key, write=False)
    with connection() as conn:
        return jsonify({"items": catalog.list_secrets(conn, key)})


@bp.delete("/<workflow_key:key>/webhook-secrets/<int:secret_id>")
@key_required
@requires(Access.ADMINISTER)
def revoke_secret(key: str, secret_id: int) -> tuple[str, int]:
    """Revoke a signing secret."""
    authorize(key, write=True)
    with connection() as conn:
        catalog.revoke_secret(conn, key, secret_id)
        encryption_key = current_app.extensions["flowforge.settings"].encryption_key
        intake.TARGETS.forget(conn, key, encryption_key)
    return "", 204
