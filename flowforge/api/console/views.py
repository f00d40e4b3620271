"""The console's pages under /ui/: server-rendered HTML, every action a plain form that
redirects (JavaScript only refreshes a live execution's fragment)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import psycopg
from flask import (
    Blueprint,
    Response,
    g,
    make_response,
    redirect,
    render_template,
    request,
    url_for,
)
from werkzeug.wrappers import Response as BaseResponse

from flowforge import (
    actions,
    apikeys,
    catalog,
    defdiff,
    definitions,
    schedules,
    search,
    sessions,
    timeline,
)
from flowforge.api.console import forms, graph, operate
from flowforge.api.console.session import (
    COOKIE,
    SIGNIN_COOKIE,
    SignInNeeded,
    clear_cookie,
    may,
    new_signin_token,
    require,
    same_token,
    set_cookie,
    signed_in,
)
from flowforge.api.pool import connection
from flowforge.api.problems import Problem
from flowforge.engine import RETRIED_STEP
from flowforge.errors import ClientError
from flowforge.model import RESOLUTIONS, TERMINAL_EXECUTION, StepStatus

bp = Blueprint(
    "console",
    __name__,
    url_prefix="/ui",
    template_folder="templates",
    static_folder="static",
)

PAGE_SIZE = 50
# A bulk action walks at most this many executions per POST (one unit of work each),
# well inside gunicorn's 15 s worker timeout; the page then offers (and, with JavaScript,
# submits) the next batch.
BULK_BATCH = 100
BULK_COUNT_CAP = 10_000
BULK_ACTIONS: dict[str, tuple[str, ...]] = {
    "cancel": ("queued", "running", "waiting", "needs_attention"),
    "retry": tuple(sorted(s.value for s in actions.RETRIED_EXECUTION)),
}
LIVE_EXECUTION = frozenset({"queued", "running", "waiting"})
# No other site may frame, script or post into the console; its own files only.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@bp.after_request
def _harden(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


@bp.errorhandler(SignInNeeded)
def _sign_in(_exc: SignInNeeded) -> BaseResponse | tuple[str, int]:
    if request.headers.get("X-Requested-With") == "fetch":
        # The live page's script: a sign-in form is no fragment; it stops polling on 401.
        return render_template(
            "error.html", status=401, title="Unauthorized", detail="sign in again"
        ), 401
    return redirect(url_for("console.signin", next=request.full_path.rstrip("?")), 303)


@bp.errorhandler(Problem)
def _problem_page(exc: Problem) -> tuple[str, int]:
    return render_template("error.html", status=exc.status, title=exc.title, detail=exc.detail), (
        exc.status
    )


@bp.errorhandler(ClientError)
def _client_error_page(exc: ClientError) -> tuple[str, int]:
    return render_template(
        "error.html", status=exc.status, title=exc.title, detail=exc.detail
    ), exc.status


@bp.app_template_filter("pretty")
def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


@bp.app_template_filter("when")
def _when(value: str | datetime | None) -> str:
    if value is None:
        return "—"
    instant = datetime.fromisoformat(value) if isinstance(value, str) else value
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _csrf() -> str:
    return str(g.console_session.csrf_token)


def _safe_next(target: str | None, default: str) -> str:
    """Only a path of the console itself: never another site (//host, scheme:)."""
    if target and target.startswith("/ui/") and not target.startswith("//") and "\\" not in target:
        return target
    return default


# ---- signing in --------------------------------------------------------------------


@bp.get("/")
def index() -> BaseResponse:
    """The console starts at the executions list."""
    return redirect(url_for("console.executions"), 303)


@bp.get("/signin")
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
def signin_post() -> BaseResponse:
    """Check the key, open a session, set its cookie."""
    if not same_token(request.form.get("csrf"), request.cookies.get(SIGNIN_COOKIE)):
        raise Problem(403, "Forbidden", "the sign-in form's token is missing or wrong; reload it")
    presented = request.form.get("api_key", "").strip()
    with connection() as conn:
        key = apikeys.authenticate(conn, presented) if presented else None
        if key is None:
            # The form again, with the error: a dead-end page would make the operator
            # find their way back to the form to try another key.
            return _signin_page(
                "That API key is not valid, or it was revoked.", 401, request.form["csrf"]
            )
        token = sessions.start(conn, key)
    response = redirect(_safe_next(request.form.get("next"), url_for("console.executions")), 303)
    set_cookie(response, COOKIE, token, max_age=sessions.SESSION_TTL_S)
    clear_cookie(response, SIGNIN_COOKIE)
    return response


@bp.post("/signout")
@signed_in
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
def executions() -> str:
    """The filtered list, newest first, with bounded counts per status."""
    after = request.args.get("after")
    with connection() as conn:
        query = forms.parse_query(conn, request.args, g.api_key)
        after_id = timeline.decode_cursor(after) if after else None
        rows = search.page(conn, query.filter, limit=PAGE_SIZE + 1, after=after_id)
        counts = search.status_counts(conn, query.filter)
        workflows = _workflow_choices(conn)
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
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
        can_write=not g.api_key.read_only,
    )


def _retry_label(statuses: set[str]) -> str:
    """What the retry button does to this execution, in words: "Retry failed steps" on a
    cancelled execution where nothing failed would promise what it does not do."""
    failed, cancelled = StepStatus.FAILED in statuses, StepStatus.CANCELLED in statuses
    if failed and cancelled:
        return "Retry failed and cancelled steps"
    if failed:
        return "Retry failed steps"
    if cancelled:
        return "Re-run cancelled steps"
    return "Run the remaining steps"


def _detail(conn: psycopg.Connection, execution_id: str) -> dict[str, Any]:
    """What the execution page shows: the read model plus the definition and geometry."""
    workflow = timeline.workflow_of(conn, execution_id)
    require(workflow, write=False)
    detail = timeline.execution_detail(conn, execution_id)
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
    # Anything to refresh for: the execution moves on by itself, or a step still does.
    live = detail["status"] in LIVE_EXECUTION or any(
        s["status"] in {"ready", "running"} for s in detail["steps"]
    )
    writable = may(detail["workflow"], write=True)
    return {
        "e": detail,
        "definition": document,
        "raw_steps": raw_steps,
        "dag": graph.layout(list(raw_steps.values()), statuses),
        "timeline": graph.timeline(created, ended, attempts, list(raw_steps)),
        "axis_w": graph.AXIS_W,
        "box": {"w": graph.BOX_W, "h": graph.BOX_H},
        "live": live,
        "can_cancel": writable and detail["status"] not in TERMINAL_EXECUTION,
        # As actions.retry decides: with an unknown step, only if something else can re-run.
        "can_retry": writable
        and detail["status"] in actions.RETRIED_EXECUTION
        and (
            any(s["status"] in RETRIED_STEP for s in detail["steps"])
            or not any(s["status"] == StepStatus.UNKNOWN for s in detail["steps"])
        ),
        "retry_label": _retry_label({s["status"] for s in detail["steps"]}),
        "can_resolve": writable,
        "wait_open": {
            s["id"]
            for s in detail["steps"]
            if writable and s["type"] == "wait" and s["status"] == StepStatus.WAITING
        },
        "resolutions": RESOLUTIONS,
        "csrf": _csrf(),
    }


@bp.get("/executions/<execution_id:execution_id>")
@signed_in
def execution(execution_id: str) -> str:
    """One execution: DAG, attempts on a time axis, history, request and response."""
    with connection() as conn:
        context = _detail(conn, execution_id)
    return render_template("execution.html", **context)


@bp.get("/executions/<execution_id:execution_id>/live")
@signed_in
def execution_live(execution_id: str) -> Response:
    """The part of the execution page that changes, for the page's polling script;
    X-Live says whether it is worth asking again."""
    with connection() as conn:
        context = _detail(conn, execution_id)
    response = make_response(render_template("_execution_live.html", **context))
    response.headers["X-Live"] = "1" if context["live"] else "0"
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
        raise Problem(404, "Not found", "no such step")
    return step_id


@bp.post("/executions/<execution_id:execution_id>/cancel")
@signed_in
def cancel(execution_id: str) -> BaseResponse:
    """Cancel, then back to the execution."""
    key = _act_on(execution_id)
    with connection() as conn:
        operate.cancel(conn, key, execution_id)
    return _back(execution_id)


@bp.post("/executions/<execution_id:execution_id>/retry")
@signed_in
def retry(execution_id: str) -> BaseResponse:
    """Retry the failed and cancelled steps, then back to the execution."""
    key = _act_on(execution_id)
    with connection() as conn:
        operate.retry(conn, key, execution_id)
    return _back(execution_id)


@bp.post("/executions/<execution_id:execution_id>/steps/<step_id>/resolve")
@signed_in
def resolve(execution_id: str, step_id: str) -> BaseResponse:
    """Settle an unknown step: outcome succeeded (with the output typed) or failed."""
    key = _act_on(execution_id)
    outcome = request.form.get("outcome", "")
    if outcome not in RESOLUTIONS:
        raise Problem(422, "Invalid resolution", "outcome must be succeeded or failed")
    output = forms.json_field(request.form, "output") if outcome == "succeeded" else None
    with connection() as conn:
        operate.resolve(conn, key, execution_id, _step_id(step_id), outcome, output)
    return _back(execution_id)


@bp.post("/executions/<execution_id:execution_id>/steps/<step_id>/complete")
@signed_in
def complete(execution_id: str, step_id: str) -> BaseResponse:
    """End a waiting wait step with the output typed."""
    key = _act_on(execution_id)
    output = forms.json_field(request.form, "output")
    with connection() as conn:
        operate.complete_wait(conn, key, execution_id, _step_id(step_id), output)
    return _back(execution_id)


@bp.post("/executions/<execution_id:execution_id>/steps/<step_id>/fail")
@signed_in
def fail(execution_id: str, step_id: str) -> BaseResponse:
    """Fail a waiting wait step."""
    key = _act_on(execution_id)
    with connection() as conn:
        operate.fail_wait(conn, key, execution_id, _step_id(step_id))
    return _back(execution_id)


# ---- attention ---------------------------------------------------------------------


@bp.get("/attention")
@signed_in
def attention() -> str:
    """Every unknown step (under any execution status) and needs_attention execution,
    oldest first, with what was sent and when, and the resolve forms."""
    key: apikeys.ApiKey = g.api_key
    with connection() as conn:
        steps, executions_left = search.attention(conn, key.workflows)
    for row in steps:
        by_id = {s["id"]: s for s in row["definition"].get("steps", [])}
        row["request"] = by_id.get(row["step_id"], {}).get("request")
        row["writable"] = may(row["workflow"], write=True)
    return render_template(
        "attention.html",
        steps=steps,
        executions=executions_left,
        resolutions=RESOLUTIONS,
        csrf=_csrf(),
    )


# ---- bulk --------------------------------------------------------------------------


def _bulk_action(text: str | None) -> str:
    if text not in BULK_ACTIONS:
        raise Problem(400, "Invalid action", "action must be cancel or retry")
    return text


@bp.get("/bulk")
@signed_in
def bulk() -> str:
    """Preview: how many executions the current filter's action would touch, bounded,
    and the confirmation form, which fixes the newest one so later arrivals stay out."""
    action = _bulk_action(request.args.get("action"))
    require(request.args.get("workflow") or None, write=True)
    with connection() as conn:
        query = forms.parse_query(conn, request.args, g.api_key)
        flt = query.filter.narrowed(BULK_ACTIONS[action])
        count, capped = search.bulk_count(conn, flt, BULK_COUNT_CAP)
        newest = search.page(conn, flt, limit=1)
    return render_template(
        "bulk.html",
        action=action,
        query=query,
        count=f"{count}+" if capped else str(count),
        upto=str(newest[0]["id"]) if newest else None,
        eligible=BULK_ACTIONS[action],
        csrf=_csrf(),
        result=None,
    )


@bp.post("/bulk")
@signed_in
def bulk_post() -> str:
    """One batch of the confirmed action, newest first from the cursor; each execution
    in its own unit of work, recorded in its history with the actor. Executions that
    moved on since the preview (no longer cancellable or retryable) are skipped."""
    action = _bulk_action(request.form.get("action"))
    key = require(request.form.get("workflow") or None, write=True)
    upto = request.form.get("upto", "")
    after = request.form.get("after") or None
    done, skipped = _tally("done"), _tally("skipped")
    with connection() as conn:
        query = forms.parse_query(conn, request.form, key)
        try:
            flt = dataclasses.replace(query.filter, upto=_uuid(upto))
            after_id = _uuid(after) if after else None
        except ValueError:
            raise Problem(400, "Invalid bulk action", "confirm from the preview page") from None
        flt = flt.narrowed(BULK_ACTIONS[action])
        batch = search.page(conn, flt, limit=BULK_BATCH, after=after_id)
        for row in batch:
            if not may(row["workflow"], write=True):
                skipped += 1
                continue
            try:
                if action == "cancel":
                    operate.cancel(conn, key, str(row["id"]))
                else:
                    operate.retry(conn, key, str(row["id"]))
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
        csrf=_csrf(),
        result={"done": done, "skipped": skipped, "after": last},
    )


def _tally(name: str) -> int:
    """A running count the batch pages carry forward."""
    text = request.form.get(name, "0")
    if not text.isdigit() or len(text) > 9:
        raise Problem(400, "Invalid bulk action", f"{name} must be a count")
    return int(text)


def _uuid(text: str) -> str:
    """An execution id from a hidden field; ValueError when it is not one."""
    return str(uuid.UUID(text))


# ---- workflows ---------------------------------------------------------------------


@bp.get("/workflows")
@signed_in
def workflows() -> str:
    """Every workflow the key may read, with its newest version."""
    key: apikeys.ApiKey = g.api_key
    with connection() as conn:
        rows = catalog.list_workflows(conn, list(key.workflows) if key.workflows else None)
    return render_template("workflows.html", rows=rows)


def _version_number(name: str, default: int, latest: int) -> int:
    text = request.args.get(name, "")
    if not text:
        return default
    if not text.isdigit() or not 1 <= int(text) <= latest:
        raise Problem(400, "Invalid version", f"{name} must be a version from 1 to {latest}")
    return int(text)


@bp.get("/workflows/<workflow_key:key>")
@signed_in
def workflow(key: str) -> str:
    """A workflow's versions, one definition, a diff between any two versions, and its
    schedule with the next fire times and the ledger, as the API's GET …/schedule."""
    require(key, write=False)
    with connection() as conn:
        found = catalog.get_workflow(conn, key)
        latest = found["latest_version"]
        shown = _version_number("version", latest, latest)
        a = _version_number("a", max(1, latest - 1), latest)
        b = _version_number("b", latest, latest)
        definition = catalog.get_version(conn, key, shown)["definition"]
        left = catalog.get_version(conn, key, a)["definition"]
        right = catalog.get_version(conn, key, b)["definition"]
        try:
            schedule = schedules.show(conn, key)
        except schedules.NoSchedule:
            schedule = None
    # Structural, in the author's order, and bounded whatever the definitions hold.
    diff = defdiff.diff(left, right).lines(f"version {a}", f"version {b}")
    return render_template(
        "workflow.html",
        w=found,
        shown=shown,
        definition=definition,
        a=a,
        b=b,
        diff=diff,
        schedule=schedule,
        executions_link=urlencode({"workflow": key}),
    )
