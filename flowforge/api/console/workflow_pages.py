"""The console's workflow pages: a workflow, its versions' diff, groups, re-ingest, pause
and resume, its schedule; and the open circuits of outbound limits."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import psycopg
from flask import (
    g,
    redirect,
    render_template,
    request,
    url_for,
)
from werkzeug.wrappers import Response as BaseResponse

from flowforge.api.auth import requires
from flowforge.api.console import operate
from flowforge.api.console.session import (
    may,
    require,
    signed_in,
)
from flowforge.api.console.site import bp, csrf_token
from flowforge.api.pool import connection
from flowforge.domain import defdiff, definitions
from flowforge.domain.roles import Access
from flowforge.errors import Forbidden, InvalidBody, InvalidParameter, NotFound
from flowforge.store import apikeys, catalog, outbound, schedules
from flowforge.usecases import grouping, reingest

# Groups a workflow page lists (docs/contract.md#debounce-batch).
GROUPS_SHOWN = 50


@bp.get("/workflows")
@signed_in
@requires(Access.READ)
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
        raise InvalidParameter("Invalid version", f"{name} must be a version from 1 to {latest}")
    return int(text)


@bp.get("/workflows/<workflow_key:key>")
@signed_in
@requires(Access.READ)
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
        paused = catalog.workflow_pause(conn, key)
        # docs/contract.md#debounce-batch: open (and closed, due) groups first, then the last
        # started ones.
        groups = sorted(
            grouping.groups(conn, key, None, limit=GROUPS_SHOWN),
            key=lambda g: (g["status"] not in ("open", "closed"), -g["id"]),
        )
    # Structural, in the author's order, and bounded whatever the definitions hold.
    diff = defdiff.diff(left, right).lines(f"version {a}", f"version {b}")
    return render_template(
        "workflow.html",
        w=found,
        paused=paused,
        writable=may(key, write=True, access=Access.OPERATE),
        editable=may(key, write=True, access=Access.ADMINISTER),
        csrf=csrf_token(),
        shown=shown,
        definition=definition,
        a=a,
        b=b,
        diff=diff,
        schedule=schedule,
        groups=groups,
        executions_link=urlencode({"workflow": key}),
    )


# ---- re-ingest (docs/contract.md#reingest) -------------------------------------------------------


def _reingest_request(form: Any, *, dry_run: bool) -> tuple[reingest.Request, dict[str, str]]:
    """A re-ingest request from the page's fields (from, to, an optional JSON filter, the
    cursor), validated by reingest.parse as the API's is; and the fields to carry on."""
    fields = {name: form.get(name, "").strip() for name in ("from", "to", "filter", "after")}
    body: dict[str, Any] = {"from": fields["from"], "to": fields["to"], "dry_run": dry_run}
    if fields["filter"]:
        try:
            body["filter"] = json.loads(fields["filter"])
        except ValueError:
            raise InvalidBody(
                "Invalid re-ingest",
                'filter must be JSON: {"path": "input.type", "op": "eq", "value": "paid"}',
            ) from None
    if fields["after"]:
        if not fields["after"].isdigit() or len(fields["after"]) > 19:
            raise InvalidParameter("Invalid re-ingest", "continue from the previous page")
        body["after"] = int(fields["after"])
    return reingest.parse(body), fields


@bp.get("/workflows/<workflow_key:key>/reingest")
@signed_in
@requires(Access.OPERATE)
def reingest_page(key: str) -> str:
    """Re-ingest archived webhooks of a range: the form, then (with a range) a dry run —
    how many of this page match and a sample — and the confirmation form."""
    require(key, write=True)
    preview = None
    fields = {"from": "", "to": "", "filter": "", "after": ""}
    if request.args.get("from") or request.args.get("to"):
        parsed, fields = _reingest_request(request.args, dry_run=True)
        with connection() as conn:
            preview = operate.reingest(conn, g.api_key, key, parsed)
    return _reingest_form(key, fields, preview=preview)


@bp.post("/workflows/<workflow_key:key>/reingest")
@signed_in
@requires(Access.OPERATE)
def reingest_post(key: str) -> str:
    """The confirmed re-ingest of one page (at most reingest.MAX_PER_REQUEST executions of
    the newest version, with the signed-in key as actor); `next` continues the range."""
    api_key = require(key, write=True)
    parsed, fields = _reingest_request(request.form, dry_run=False)
    with connection() as conn:
        result = operate.reingest(conn, api_key, key, parsed)
    return _reingest_form(key, fields, result=result)


def _reingest_form(
    key: str, fields: dict[str, str], *, preview: Any = None, result: Any = None
) -> str:
    """The re-ingest page: the form with what was asked, and either a dry run's preview
    (before confirming) or the confirmed page's result (to continue from `next`)."""
    return render_template(
        "reingest.html", key=key, fields=fields, preview=preview, result=result, csrf=csrf_token()
    )


@bp.post("/workflows/<workflow_key:key>/pause")
@signed_in
@requires(Access.OPERATE)
def pause_workflow(key: str) -> BaseResponse:
    """Pause a workflow (docs/contract.md#pause), then back to its page."""
    api_key = require(key, write=True)
    with connection() as conn:
        operate.pause_workflow(conn, api_key, key)
    return redirect(url_for("console.workflow", key=key), 303)


@bp.post("/workflows/<workflow_key:key>/resume")
@signed_in
@requires(Access.OPERATE)
def resume_workflow(key: str) -> BaseResponse:
    """Resume a workflow (with `onto`, a version number: its never-started executions
    re-pinned onto it first), then back to its page."""
    api_key = require(key, write=True)
    onto = request.form.get("onto", "")
    with connection() as conn:
        operate.resume_workflow(conn, api_key, key, int(onto) if onto.isdigit() else None)
    return redirect(url_for("console.workflow", key=key), 303)


# ---- schedules (docs/contract.md#schedules), as the API's schedule endpoints ---------------------


def _back_to_workflow(key: str) -> BaseResponse:
    return redirect(url_for("console.workflow", key=key) + "#schedule", 303)


def _on_schedule(
    key: str, act: Callable[[psycopg.Connection, apikeys.ApiKey, str], Any]
) -> BaseResponse:
    """Pause or resume the schedule through operate, then back to the workflow."""
    api_key = require(key, write=True)
    with connection() as conn:
        act(conn, api_key, key)
    return _back_to_workflow(key)


@bp.post("/workflows/<workflow_key:key>/schedule/pause")
@signed_in
@requires(Access.OPERATE)
def pause_schedule(key: str) -> BaseResponse:
    """Pause the schedule (due ticks are ledgered paused), then back to the workflow."""
    return _on_schedule(key, operate.pause_schedule)


@bp.post("/workflows/<workflow_key:key>/schedule/resume")
@signed_in
@requires(Access.OPERATE)
def resume_schedule(key: str) -> BaseResponse:
    """Resume the schedule, then back to the workflow."""
    return _on_schedule(key, operate.resume_schedule)


@bp.post("/workflows/<workflow_key:key>/schedule/trigger")
@signed_in
@requires(Access.OPERATE)
def trigger_schedule(key: str) -> BaseResponse:
    """Fire a tick now; on to its execution, or back to the ledger, whose newest row says
    why none started (skipped under the overlap policy, buffered)."""
    api_key = require(key, write=True)
    with connection() as conn:
        tick = operate.trigger_schedule(conn, api_key, key)
    if tick["execution_id"]:
        return redirect(url_for("console.execution", execution_id=tick["execution_id"]), 303)
    return _back_to_workflow(key)


def _form_instant(name: str) -> datetime:
    """A backfill bound from the form: a datetime-local value is UTC, as the form says;
    one with an offset keeps it."""
    text = request.form.get(name, "").strip()
    try:
        moment = datetime.fromisoformat(text)
        return definitions.parse_until(
            (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()
        )
    except ValueError:
        raise InvalidParameter(
            "Invalid backfill", f"{name} must be a date and time such as 2026-12-01T09:30"
        ) from None


@bp.post("/workflows/<workflow_key:key>/schedule/backfill")
@signed_in
@requires(Access.OPERATE)
def backfill_schedule(key: str) -> str:
    """A backfill's dry run (the ticks it would fire, and a button to fire them) or the
    backfill itself (what became of each tick)."""
    api_key = require(key, write=True)
    start, end = _form_instant("from"), _form_instant("to")
    if end < start:
        raise InvalidParameter("Invalid backfill", "to must not be before from")
    dry_run = request.form.get("dry_run") == "1"
    with connection() as conn:
        items = operate.backfill_schedule(conn, api_key, key, start, end, dry_run=dry_run)
    return render_template(
        "backfill.html",
        key=key,
        items=items,
        dry_run=dry_run,
        start=request.form["from"],
        end=request.form["to"],
        csrf=csrf_token(),
    )


# ---- open circuits (docs/contract.md#circuits) ---------------------------------------------------


@bp.get("/circuits")
@signed_in
@requires(Access.READ)
def circuits() -> str:
    """The limits whose circuit is open or half-open or that a Retry-After holds, with a
    close button where the key may write: a workflow's own limits for a key that may
    write that workflow, the operator's host and shared limits for a key for every
    workflow (docs/reference/security.md, "Who owns a limit")."""
    key: apikeys.ApiKey = g.api_key
    with connection() as conn:
        found = outbound.open_or_held(conn, key.workflows)
    for row in found:
        if row["workflow"] is None:
            row["closable"] = key.workflows is None and may(
                None, write=True, access=Access.ADMINISTER
            )
        else:
            row["closable"] = may(row["workflow"], write=True, access=Access.ADMINISTER)
    return render_template(
        "circuits.html",
        circuits=found,
        closable=any(row["closable"] for row in found),
        closed=request.args.get("closed"),
        csrf=csrf_token(),
    )


@bp.post("/circuits/close")
@signed_in
@requires(Access.ADMINISTER)
def close_circuit() -> BaseResponse:
    """Close a limit's circuit and end its hold by hand (the operator knows the host is
    back): its waiting steps go at once. The same rule as POST
    /api/v1/circuits/{key}/close."""
    workflow = request.form.get("workflow") or None
    key: apikeys.ApiKey = require(workflow, write=True)
    if workflow is None and key.workflows is not None:
        raise Forbidden("the operator's limits need a key for every workflow")
    circuit = request.form.get("key", "")
    if not circuit:
        raise InvalidParameter("Invalid circuit", "name the circuit's key")
    with connection() as conn:
        if not operate.close_circuit(conn, circuit, workflow):
            raise NotFound(f"no open circuit or hold has key {circuit!r}")
    return redirect(url_for("console.circuits", closed=circuit), 303)
