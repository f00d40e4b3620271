"""The console's pages under /ui/: server-rendered HTML, every action a plain form that
redirects (JavaScript only refreshes a live execution's fragment)."""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from flask import (
    Response,
    g,
    make_response,
    redirect,
    render_template,
    request,
    url_for,
)
from werkzeug.wrappers import Response as BaseResponse

from flowforge.api.auth import requires
from flowforge.api.console import forms, graph, operate
from flowforge.api.console.session import (
    COOKIE,
    SIGNIN_COOKIE,
    clear_cookie,
    may,
    new_signin_token,
    require,
    same_token,
    set_cookie,
    signed_in,
)
from flowforge.api.console.site import bp, csrf_token
from flowforge.api.paths import action_step
from flowforge.api.pool import connection
from flowforge.domain import definitions, operations
from flowforge.domain.model import (
    LIVE_EXECUTION,
    RESOLUTIONS,
    TERMINAL_EXECUTION,
    AttemptOutcome,
    ExecutionStatus,
    ItemStatus,
    StepStatus,
    is_key,
)
from flowforge.domain.operations import Kind
from flowforge.domain.roles import Access
from flowforge.errors import ClientError, Forbidden, InvalidBody, InvalidParameter, NotFound
from flowforge.store import apikeys, catalog, failures, search, sessions, timeline
from flowforge.usecases import grouping, replay

PAGE_SIZE = 50
# How often the list's script asks how many executions changed since it was loaded.
CHANGED_EVERY_S = 30
# A bulk action walks at most this many executions per POST (one unit of work each),
# well inside gunicorn's 15 s worker timeout; the page then offers (and, with JavaScript,
# submits) the next batch.
BULK_BATCH = 100
BULK_COUNT_CAP = 10_000
BULK_ACTIONS: dict[str, tuple[str, ...]] = {
    # A paused execution is cancelled from its own page.
    "cancel": tuple(s.value for s in LIVE_EXECUTION if s != ExecutionStatus.PAUSED),
    "retry": tuple(sorted(s.value for s in operations.RETRIED_EXECUTION)),
    # docs/contract.md#replay: replayed from the step the confirmation names, onto the version it
    # names.
    "replay": tuple(sorted(s.value for s in replay.REPLAYABLE)),
}
# The statuses of an execution that moves on by itself (the page refreshes for them).
MOVES_ON = frozenset(LIVE_EXECUTION) - {ExecutionStatus.PAUSED, ExecutionStatus.NEEDS_ATTENTION}


# C0 and C1 controls and DEL: CR/LF in a Location is a header injection (and werkzeug's
# refusal of it was a 500); the others have no place in a console path either.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")


def _safe_next(target: str | None, default: str) -> str:
    """Only a path of the console itself: never another site (//host, scheme:), never a
    control character."""
    if (
        target
        and target.startswith("/ui/")
        and not target.startswith("//")
        and "\\" not in target
        and not _CONTROLS.search(target)
    ):
        return target
    return default


# ---- signing in --------------------------------------------------------------------


@bp.get("/")
@requires(Access.READ)
def index() -> BaseResponse:
    """The console starts at the executions list."""
    return redirect(url_for("console.executions"), 303)


@bp.get("/signin")
@requires(Access.PUBLIC)
def signin() -> Response:
    """The sign-in form: paste an API key."""
    return _signin_page(None, 200, new_signin_token())


def _signin_page(error: str | None, status: int, token: str) -> Response:
    """The sign-in form with its double-submit token (a failed try keeps the one it
    proved), and the error of a failed try."""
    next_page = request.args.get("next") or request.form.get("next", "")
    response = make_response(
        render_template("signin.html", signin_token=token, next=next_page, error=error), status
    )
    set_cookie(response, SIGNIN_COOKIE, token, max_age=3600)
    return response


@bp.post("/signin")
@requires(Access.PUBLIC)
def signin_post() -> BaseResponse:
    """Check the key, open a session, set its cookie."""
    if not same_token(request.form.get("csrf"), request.cookies.get(SIGNIN_COOKIE)):
        raise Forbidden("the sign-in form's token is missing or wrong; reload it")
    presented = request.form.get("api_key", "").strip()
    with connection() as conn:
        key = apikeys.authenticate(conn, presented) if presented else None
        if key is None:
            # The form again, with the error: a dead-end page would make the operator
            # find their way back to the form to try another key.
            return _signin_page(
                "That API key is not valid, or it was revoked.", 401, request.form["csrf"]
            )
        destination = _safe_next(request.form.get("next"), url_for("console.executions"))
        token = sessions.start(conn, key)
    response = redirect(destination, 303)
    set_cookie(response, COOKIE, token, max_age=sessions.SESSION_TTL_S)
    clear_cookie(response, SIGNIN_COOKIE)
    return response


@bp.post("/signout")
@signed_in
@requires(Access.READ)
def signout() -> BaseResponse:
    """End the session (its row goes; the cookie is dropped)."""
    with connection() as conn:
        sessions.end(conn, request.cookies.get(COOKIE, ""))
    response = redirect(url_for("console.signin"), 303)
    clear_cookie(response, COOKIE)
    return response


# ---- executions --------------------------------------------------------------------


def _workflow_choices(conn: psycopg.Connection) -> list[str]:
    key: apikeys.ApiKey = g.api_key
    scope = list(key.workflows) if key.workflows is not None else None
    return [w["workflow"] for w in catalog.list_workflows(conn, scope)]


@bp.get("/executions")
@signed_in
@requires(Access.READ)
def executions() -> str:
    """The filtered list, newest first, with bounded counts per status."""
    after = request.args.get("after")
    with connection() as conn:
        query = forms.parse_query(conn, request.args, g.api_key)
        after_id = timeline.decode_cursor(after) if after else None
        with search.bounded(conn):
            # "N changed since you loaded it" counts from here (console/live.py).
            loaded = search.database_now(conn).isoformat()
            rows = search.page(conn, query.filter, limit=PAGE_SIZE + 1, after=after_id)
            counts = search.status_counts(conn, query.filter)
        workflows = _workflow_choices(conn)
        more = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE]
        # How each one started and its first error, for this page's rows only.
        extra = search.extras(conn, [str(r["id"]) for r in rows])
    rows = [{**r, **extra.get(str(r["id"]), {})} for r in rows]
    next_link = None
    if more:
        next_link = query.link(after=timeline.encode_cursor(str(rows[-1]["id"])))
    return render_template(
        "executions.html",
        query=query,
        rows=rows,
        counts=counts,
        statuses=search.STATUSES,
        workflows=workflows,
        next_link=next_link,
        can_write=g.api_key.may(Access.OPERATE),
        loaded=loaded,
        changed_every=CHANGED_EVERY_S,
    )


# Items of a map shown at a time on the execution page (docs/contract.md#map).
ITEM_PAGE = 20


def _item_page(conn: psycopg.Connection, detail: dict[str, Any]) -> dict[str, str]:
    """`?items=<map>&items_after=<index>&items_status=<status>`: that page of one map's
    items in place of its first one, read like the API's (timeline.map_page: counts from
    the items that did not succeed, never every item's rows). Returns the query to keep
    (the live fragment refreshes the same page)."""
    args = request.args
    map_id = args.get("items")
    if map_id is None:
        return {}
    step = next((s for s in detail["steps"] if s["id"] == map_id and "items" in s), None)
    if step is None:
        raise forms.bad("items", "not a map step of this execution")
    status = args.get("items_status") or None
    if status is not None and status not in set(ItemStatus):
        raise forms.bad("items_status", "one of " + ", ".join(ItemStatus))
    try:
        after = int(args.get("items_after", "-1"))
    except ValueError:
        raise forms.bad("items_after", "an item index") from None
    if not -1 <= after <= definitions.MAX_MAP_ITEMS:
        raise forms.bad("items_after", f"an index from -1 to {definitions.MAX_MAP_ITEMS}")
    step["items"] = timeline.map_page(
        conn, detail["id"], map_id, status=status, after=after, limit=ITEM_PAGE
    )
    step["items"]["status"] = status
    query = {"items": map_id, "items_after": str(after)}
    return {**query, "items_status": status} if status else query


def _detail(conn: psycopg.Connection, execution_id: str) -> dict[str, Any]:
    """What the execution page shows: the read model plus the definition and geometry."""
    workflow = timeline.workflow_of(conn, execution_id)
    require(workflow, write=False)
    # Read first: a change in between makes the next poll answer at once, never missed.
    now = timeline.change_version(conn, execution_id)
    detail = timeline.execution_detail(conn, execution_id)
    item_query = _item_page(conn, detail)
    document = catalog.get_version(conn, detail["workflow"], detail["version"])["definition"]
    raw_steps = {s["id"]: s for s in document.get("steps", [])}
    statuses = {s["id"]: s["status"] for s in detail["steps"]}
    created = datetime.fromisoformat(detail["created_at"])
    ended = (
        datetime.fromisoformat(detail["finished_at"])
        if detail["finished_at"] and detail["status"] in TERMINAL_EXECUTION
        else datetime.now(UTC)
    )
    attempts = [
        {
            **a,
            "step_id": s["id"],
            "started_at": datetime.fromisoformat(a["started_at"]),
            "finished_at": datetime.fromisoformat(a["finished_at"]) if a["finished_at"] else None,
        }
        for s in detail["steps"]
        for a in s["attempts"]
    ]
    attempts.sort(key=lambda a: a["started_at"])
    took = {(a["step_id"], a["attempt"]): graph.attempt_took(a, ended) for a in attempts}
    for s in detail["steps"]:
        for a in s["attempts"]:
            a["took"] = took.get((s["id"], a["attempt"]))
    # Anything to refresh for: the execution moves on by itself, or a step still does.
    live = detail["status"] in MOVES_ON or any(
        s["status"] in {StepStatus.READY, StepStatus.RUNNING} for s in detail["steps"]
    )
    writable = may(detail["workflow"], write=True, access=Access.OPERATE)
    shown = operations.Shown(
        status=detail["status"],
        steps=tuple((s["id"], s["status"]) for s in detail["steps"]),
        cancel_requested=bool(detail["cancel_requested_at"]),
    )
    return {
        "e": detail,
        "item_query": item_query,
        "item_page": ITEM_PAGE,
        "definition": document,
        "raw_steps": raw_steps,
        "dag": graph.layout(list(raw_steps.values()), statuses),
        "timeline": graph.timeline(created, ended, attempts, list(raw_steps), detail["steps"]),
        "axis_w": graph.AXIS_W,
        "box": {"w": graph.BOX_W, "h": graph.BOX_H},
        "live": live,
        # The page watches for changes (console/live.py) until the execution is over.
        "watch": detail["status"] not in TERMINAL_EXECUTION,
        "change_version": now.version if now is not None else "",
        "buttons": [
            (action, action.button.text(shown))
            for action in operations.ACTIONS
            if writable and action.button is not None and action.button.offered(shown)
        ],
        "can_resolve": writable,
        "wait_open": {
            s["id"]
            for s in detail["steps"]
            if writable and s["type"] == "wait" and s["status"] == StepStatus.WAITING
        },
        "resolutions": RESOLUTIONS,
        "csrf": csrf_token(),
        # docs/contract.md#pause: why it does not move (paused, or its workflow is) and what may be
        # done.
        "pause_state": detail["flow_control"],
        "replay": replay.links(conn, execution_id),
        # docs/contract.md#debounce-batch: the debounce or batch group it was started from, with its
        # events.
        "built_from": grouping.built_from(conn, execution_id),
        "can_replay": writable and detail["status"] in replay.REPLAYABLE,
        "latest_version": catalog.get_workflow(conn, detail["workflow"])["latest_version"],
    }


@bp.get("/executions/<execution_id:execution_id>")
@signed_in
@requires(Access.READ)
def execution(execution_id: str) -> str:
    """One execution: DAG, attempts on a time axis, history, request and response."""
    with connection() as conn:
        context = _detail(conn, execution_id)
    return render_template("execution.html", **context)


@bp.get("/executions/<execution_id:execution_id>/live")
@signed_in
@requires(Access.READ)
def execution_live(execution_id: str) -> Response:
    """The part of the execution page that changes, for the page's script; X-Live says
    whether to watch on, X-Version is the version it shows (console/live.py)."""
    with connection() as conn:
        context = _detail(conn, execution_id)
    response = make_response(render_template("_execution_live.html", **context))
    response.headers["X-Live"] = "1" if context["watch"] else "0"
    response.headers["X-Version"] = context["change_version"]
    return response


def _act_on(execution_id: str) -> apikeys.ApiKey:
    with connection() as conn:
        workflow = timeline.workflow_of(conn, execution_id)
    return require(workflow, write=True)


def _back(execution_id: str) -> BaseResponse:
    default = url_for("console.execution", execution_id=execution_id)
    return redirect(_safe_next(request.form.get("next"), default), 303)


def _step_id(step_id: str) -> str:
    if not definitions.is_step_id(step_id):
        raise NotFound("no such step")
    return step_id


def _form_values(action: operations.Action, step_id: str | None) -> list[Any]:
    """The values of an action's params from its form, in their order (a failed
    resolution's output is not read: the form's box may hold anything then)."""
    values: list[Any] = action_step(action, step_id)
    outcome = None
    for param in action.fields:
        if param.kind is Kind.OUTCOME:
            outcome = request.form.get("outcome", "")
            if outcome not in RESOLUTIONS:
                raise InvalidBody("Invalid resolution", "outcome must be succeeded or failed")
            values.append(outcome)
        elif outcome != AttemptOutcome.FAILED:
            values.append(forms.json_field(request.form, param.field))
        else:
            values.append(None)
    return values


def _action_route(action: operations.Action) -> Callable[..., BaseResponse]:
    """The console's route of a declared action (flowforge/domain/operations.py): run it
    with the signed-in key as the actor, then back to the execution."""

    def act(execution_id: str, step_id: str | None = None) -> BaseResponse:
        key = _act_on(execution_id)
        values = _form_values(action, step_id)
        with connection() as conn:
            operate.act(conn, key, action, execution_id, values)
        return _back(execution_id)

    act.__doc__ = f"{action.summary}; then back to the execution."
    return signed_in(requires(Access.OPERATE)(act))


for _action in operations.ACTIONS:
    bp.add_url_rule(
        "/executions/" + _action.path("<execution_id:execution_id>", "<step_id>"),
        endpoint=_action.name,
        view_func=_action_route(_action),
        methods=["POST"],
    )


@bp.post("/executions/<execution_id:execution_id>/replay")
@signed_in
@requires(Access.OPERATE)
def replay_one(execution_id: str) -> BaseResponse:
    """Replay from the chosen step onto the chosen version (its own or the newest), then
    on to the new execution."""
    key = _act_on(execution_id)
    from_step = _step_id(request.form.get("from_step", ""))
    text = request.form.get("version", "latest")
    if text != "latest" and not (text.isdigit() and 1 <= int(text) <= 2**31 - 1):
        raise InvalidParameter("Invalid version", "version must be a number or latest")
    version = None if text == "latest" else int(text)
    with connection() as conn:
        made = operate.replay(conn, key, execution_id, from_step, version)
    return redirect(url_for("console.execution", execution_id=made), 303)


# ---- attention ---------------------------------------------------------------------


@bp.get("/attention")
@signed_in
@requires(Access.READ)
def attention() -> str:
    """Every unknown step (under any execution status) and needs_attention execution,
    oldest first, with what was sent and when, and the resolve forms."""
    key: apikeys.ApiKey = g.api_key
    with connection() as conn:
        steps, executions_left = search.attention(conn, key.workflows)
    for row in steps:
        by_id = {s["id"]: s for s in row["definition"].get("steps", [])}
        row["request"] = by_id.get(row["step_id"], {}).get("request")
        row["writable"] = may(row["workflow"], write=True, access=Access.OPERATE)
    return render_template(
        "attention.html",
        steps=steps,
        executions=executions_left,
        resolutions=RESOLUTIONS,
        csrf=csrf_token(),
    )


# ---- the failed inbox (docs/contract.md#failed-inbox) --------------------------------------------

FAILED_ACTIONS = ("replay", "retry")


@bp.get("/failed")
@signed_in
@requires(Access.READ)
def failed() -> str:
    """Failed executions not replayed yet, grouped by workflow, failed step and error,
    oldest group first, each with its bulk replay (onto the newest version, from the
    failed step) and bulk retry."""
    key: apikeys.ApiKey = g.api_key
    with connection() as conn:
        groups = replay.failed_groups(conn, key.workflows)
        signatures = failures.list_groups(conn, workflows=key.workflows)
    for group in groups + signatures:
        group["writable"] = may(group["workflow"], write=True, access=Access.OPERATE)
    return render_template(
        "failed.html", groups=groups, signatures=signatures, csrf=csrf_token(), result=None
    )


FAILURE_GROUP_ACTIONS = ("resolve", "ignore", "reopen", "replay", "retry")
MAX_GROUP_ID = 2**63 - 1  # a bigint


@bp.post("/failed/groups/<int:group_id>")
@signed_in
@requires(Access.OPERATE)
def failure_group_post(group_id: int) -> BaseResponse:
    """docs/contract.md#failure-groups: a failure group's action from the failed inbox
    (resolve, ignore, reopen; replay or retry one batch), then back to the inbox."""
    action = request.form.get("action")
    if action not in FAILURE_GROUP_ACTIONS:
        raise InvalidParameter("Invalid action", "not an action on a failure group")
    if group_id > MAX_GROUP_ID:
        raise NotFound("no such failure group")
    with connection() as conn:
        group = failures.get(conn, group_id, samples=0)
        key = require(group["workflow"], write=True)
        operate.failure_group(conn, key, group_id, action)
    return redirect(url_for("console.failed"))


@bp.post("/failed")
@signed_in
@requires(Access.OPERATE)
def failed_post() -> str:
    """One batch of a group's bulk action, oldest first, up to the `upto` the inbox
    showed; each execution in its own unit of work with the signed-in key as actor. One
    that moved on or is refused is counted as skipped."""
    action = request.form.get("action")
    if action not in FAILED_ACTIONS:
        raise InvalidParameter("Invalid action", "action must be replay or retry")
    workflow = request.form.get("workflow", "")
    if not is_key(workflow):
        raise InvalidParameter("Invalid workflow", "workflow must be a workflow key")
    key = require(workflow, write=True)
    step_id = _step_id(request.form.get("step", ""))
    error = request.form.get("error") or None
    try:
        upto = _uuid(request.form.get("upto", ""))
        after = _uuid(request.form["after"]) if request.form.get("after") else None
    except ValueError:
        raise InvalidParameter("Invalid bulk action", "confirm from the failed inbox") from None
    done, skipped = _tally("done"), _tally("skipped")
    flt = replay.Filter(workflow=workflow, status=ExecutionStatus.FAILED, step=step_id)
    with connection() as conn:
        ids = replay.batch_ids(conn, flt, upto=upto, after=after, limit=BULK_BATCH)
        for execution_id in ids:
            if error is not None and not replay.failed_with(conn, execution_id, step_id, error):
                continue
            try:
                if action == "replay":
                    operate.replay_onto_newest(conn, key, execution_id, step_id)
                else:
                    operate.act(conn, key, operations.BY_NAME["retry"], execution_id, ())
                done += 1
            except ClientError:
                skipped += 1
    result = {
        "action": action,
        "workflow": workflow,
        "step": step_id,
        "error": error or "",
        "upto": upto,
        "done": done,
        "skipped": skipped,
        "after": ids[-1] if len(ids) == BULK_BATCH else None,
    }
    return render_template("failed.html", groups=[], csrf=csrf_token(), result=result)


# ---- bulk --------------------------------------------------------------------------


def _bulk_action(text: str | None) -> str:
    if text not in BULK_ACTIONS:
        raise InvalidParameter("Invalid action", "action must be cancel, retry or replay")
    return text


@bp.get("/bulk")
@signed_in
@requires(Access.OPERATE)
def bulk() -> str:
    """Preview: how many executions the current filter's action would touch, bounded,
    and the confirmation form, which fixes the newest one so later arrivals stay out."""
    action = _bulk_action(request.args.get("action"))
    require(request.args.get("workflow") or None, write=True)
    with connection() as conn:
        query = forms.parse_query(conn, request.args, g.api_key)
        flt = query.filter.narrowed(BULK_ACTIONS[action])
        with search.bounded(conn):
            count, capped = search.bulk_count(conn, flt, BULK_COUNT_CAP)
            newest = search.page(conn, flt, limit=1)
    return render_template(
        "bulk.html",
        action=action,
        query=query,
        count=f"{count}+" if capped else str(count),
        upto=str(newest[0]["id"]) if newest else None,
        eligible=BULK_ACTIONS[action],
        csrf=csrf_token(),
        result=None,
    )


@bp.post("/bulk")
@signed_in
@requires(Access.OPERATE)
def bulk_post() -> str:
    """One batch of the confirmed action, newest first from the cursor; each execution
    in its own unit of work, recorded in its history with the actor. Executions that
    moved on since the preview (no longer cancellable or retryable) are skipped."""
    action = _bulk_action(request.form.get("action"))
    key = require(request.form.get("workflow") or None, write=True)
    upto = request.form.get("upto", "")
    after = request.form.get("after") or None
    done, skipped = _tally("done"), _tally("skipped")
    target = _replay_target() if action == "replay" else None
    with connection() as conn:
        query = forms.parse_query(conn, request.form, key)
        try:
            flt = dataclasses.replace(query.filter, upto=_uuid(upto))
            after_id = _uuid(after) if after else None
        except ValueError:
            raise InvalidParameter("Invalid bulk action", "confirm from the preview page") from None
        flt = flt.narrowed(BULK_ACTIONS[action])
        with search.bounded(conn):
            batch = search.page(conn, flt, limit=BULK_BATCH, after=after_id)
        for row in batch:
            if not may(row["workflow"], write=True):
                skipped += 1
                continue
            try:
                if target is not None:
                    operate.replay(conn, key, str(row["id"]), *target)
                else:
                    operate.act(conn, key, operations.BY_NAME[action], str(row["id"]), ())
                done += 1
            except ClientError:
                skipped += 1  # it moved on since the preview (finished, or nothing to retry)
    last = str(batch[-1]["id"]) if len(batch) == BULK_BATCH else None
    return render_template(
        "bulk.html",
        action=action,
        query=query,
        count=None,
        upto=upto,
        eligible=BULK_ACTIONS[action],
        csrf=csrf_token(),
        result={"done": done, "skipped": skipped, "after": last},
        replay_target=request.form if target is not None else None,
    )


def _replay_target() -> tuple[str, int | None]:
    """A bulk replay's step and version (None: the newest), from the confirmation form."""
    from_step = _step_id(request.form.get("from_step", ""))
    text = request.form.get("version", "latest")
    if text != "latest" and not (text.isdigit() and 1 <= int(text) <= 2**31 - 1):
        raise InvalidParameter("Invalid version", "version must be a number or latest")
    return from_step, None if text == "latest" else int(text)


def _tally(name: str) -> int:
    """A running count the batch pages carry forward."""
    text = request.form.get(name, "0")
    if not text.isdigit() or len(text) > 9:
        raise InvalidParameter("Invalid bulk action", f"{name} must be a count")
    return int(text)


def _uuid(text: str) -> str:
    """An execution id from a hidden field; ValueError when it is not one."""
    return str(uuid.UUID(text))


# ---- workflows ---------------------------------------------------------------------
