"""Failure groups (docs/contract.md#failure-groups): list and read them, resolve, ignore or
reopen one, and replay or retry its executions a batch at a time. A key sees and acts on
the groups of the workflows it may read or write."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, g, jsonify, request

from flowforge.api.auth import authorize, key_required, requires
from flowforge.api.bodies import json_body
from flowforge.api.pool import connection
from flowforge.api.queryargs import page_limit, readable_workflow, status_filter
from flowforge.domain.model import MAX_VERSION
from flowforge.domain.roles import Access
from flowforge.errors import InvalidBody, NotFound
from flowforge.store import failures
from flowforge.store.apikeys import ApiKey
from flowforge.usecases import replay

bp = Blueprint("failures", __name__, url_prefix="/api/v1/failure-groups")

BATCH_FIELDS = {"after", "limit"}
REPLAY_FIELDS = BATCH_FIELDS | {"from_step", "version"}
MAX_ID = 2**63 - 1  # a bigint


def _group(conn: Any, group_id: int, *, write: bool, samples: int = 0) -> dict[str, Any]:
    """The group, once the key may read (or write) its workflow (404 for no such group)."""
    if group_id > MAX_ID:
        raise NotFound("no such failure group")
    group = failures.get(conn, group_id, samples=samples)
    authorize(group["workflow"], write=write)
    return group


@bp.get("")
@key_required
@requires(Access.READ)
def list_groups() -> Response:
    """Groups, the most recently seen first; filter by `workflow` and `status`."""
    key: ApiKey = g.api_key
    args = request.args
    status = status_filter(args, failures.STATUSES)
    workflow = readable_workflow(args, key)
    limit = page_limit(args, 100)
    with connection() as conn:
        groups = failures.list_groups(
            conn, workflow=workflow, status=status, workflows=key.workflows, limit=limit
        )
    return jsonify({"groups": groups})


@bp.get("/<int:group_id>")
@key_required
@requires(Access.READ)
def show(group_id: int) -> Response:
    """One group with its newest executions."""
    with connection() as conn:
        return jsonify(_group(conn, group_id, write=False, samples=failures.SAMPLES))


def _set_status(group_id: int, action: str) -> Response:
    key: ApiKey = g.api_key
    with connection() as conn:
        _group(conn, group_id, write=True)
        return jsonify(failures.set_status(conn, group_id, action, actor=key.actor()))


@bp.post("/<int:group_id>/resolve")
@key_required
@requires(Access.OPERATE)
def resolve(group_id: int) -> Response:
    """Resolved: the next failure of its kind reopens it and alerts once."""
    return _set_status(group_id, "resolve")


@bp.post("/<int:group_id>/ignore")
@key_required
@requires(Access.OPERATE)
def ignore(group_id: int) -> Response:
    """Ignored: it counts on and never alerts."""
    return _set_status(group_id, "ignore")


@bp.post("/<int:group_id>/reopen")
@key_required
@requires(Access.OPERATE)
def reopen(group_id: int) -> Response:
    """Open again (no alert: an operator's reopen is no recurrence)."""
    return _set_status(group_id, "reopen")


def _batch_body(allowed: set[str]) -> tuple[dict[str, Any], str | None, int]:
    """The body of a replay or retry (optional: {} by default), its `after` and `limit`."""
    body = json_body() if request.get_data() else {}
    if not isinstance(body, dict):
        raise InvalidBody("Invalid batch", "send a JSON object")
    extra = sorted(set(body) - allowed)
    if extra:
        raise InvalidBody(
            "Invalid batch",
            "unexpected fields",
            errors=[{"path": f"$.{k}", "message": "unexpected field"} for k in extra],
        )
    after = body.get("after")
    if after is not None and (not isinstance(after, str) or not replay.is_uuid(after)):
        raise InvalidBody(
            "Invalid batch",
            "after must be the previous next_after",
            errors=[{"path": "$.after", "message": "an execution id"}],
        )
    limit = body.get("limit", 100)
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise InvalidBody(
            "Invalid batch",
            "limit must be an integer",
            errors=[{"path": "$.limit", "message": "an integer"}],
        )
    return body, after, limit


@bp.post("/<int:group_id>/replay")
@key_required
@requires(Access.OPERATE)
def replay_all(group_id: int) -> Response:
    """Replay one batch of the group's failed executions from `from_step` (default: the
    group's step) onto `version` (default: the newest)."""
    key: ApiKey = g.api_key
    body, after, limit = _batch_body(REPLAY_FIELDS)
    from_step = body.get("from_step")
    if from_step is not None and not isinstance(from_step, str):
        raise InvalidBody(
            "Invalid replay",
            "from_step is a step id",
            errors=[{"path": "$.from_step", "message": "a step id"}],
        )
    version = body.get("version", "latest")
    if version != "latest" and (
        not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= MAX_VERSION
    ):
        raise InvalidBody(
            "Invalid replay",
            'version is a number or "latest"',
            errors=[{"path": "$.version", "message": 'a version number or "latest"'}],
        )
    with connection() as conn:
        _group(conn, group_id, write=True)
        done = replay.replay_group(
            conn,
            group_id,
            from_step=from_step,
            version=None if version == "latest" else int(version),
            after=after,
            limit=limit,
            actor=key.actor(),
        )
    return jsonify(done)


@bp.post("/<int:group_id>/retry")
@key_required
@requires(Access.OPERATE)
def retry_all(group_id: int) -> Response:
    """Retry one batch of the group's failed executions in place."""
    key: ApiKey = g.api_key
    _body, after, limit = _batch_body(BATCH_FIELDS)
    with connection() as conn:
        _group(conn, group_id, write=True)
        done = replay.retry_group(conn, group_id, after=after, limit=limit, actor=key.actor())
    return jsonify(done)
