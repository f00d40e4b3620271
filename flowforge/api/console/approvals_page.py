"""The console's approvals (docs/contract.md#approvals): the open approvals of the signed-in
user (the key's name) and one approval's form, rendered as plain HTML (no script) and
decided by its two buttons, approve or reject. A form that does not fit is shown again
with each field's problem, and nothing is decided. Installed on the console's blueprint
by `install`, so this module imports none of views.py.

The list and the form are a viewer's reads; the decision is an operator's action
(docs/contract.md#roles).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from flowforge.api.auth import requires
from flowforge.api.console import operate
from flowforge.api.console.session import may, require, signed_in
from flowforge.api.console.site import csrf_token
from flowforge.api.pool import connection
from flowforge.domain.definitions import FormValuesInvalid, from_html, is_step_id, may_decide
from flowforge.domain.roles import Access
from flowforge.errors import NotFound
from flowforge.store import approvals, timeline


@signed_in
@requires(Access.READ)
def page() -> str:
    """The open approvals the signed-in user may decide: assigned to them or to nobody."""
    with connection() as conn:
        rows = approvals.list_open(conn, assignee=g.api_key.name, workflows=g.api_key.workflows)
    return render_template("approvals.html", approvals=rows, decided=request.args.get("decided"))


def _open(execution_id: str, step_id: str) -> dict[str, Any]:
    """The open approval, or 404 (decided already, expired, or no such approval)."""
    if not is_step_id(step_id):
        raise NotFound("no such step")
    with connection() as conn:
        require(timeline.workflow_of(conn, execution_id), write=False)
        rows = approvals.list_open(
            conn, assignee=None, workflows=g.api_key.workflows, execution_id=execution_id
        )
    for row in rows:
        if row["step"] == step_id:
            return row
    raise NotFound(f"no open approval {step_id!r} in execution {execution_id}")


def _form_page(
    row: dict[str, Any], values: dict[str, Any], problems: list[dict[str, str]], status: int
) -> tuple[str, int]:
    errors = {problem["path"].rsplit(".", 1)[-1]: problem["message"] for problem in problems}
    form = row["form"]
    return render_template(
        "approval.html",
        a=row,
        form=form,
        values=values,
        errors=errors,
        problems=problems,
        may_decide=may_decide(form, g.api_key.name) and may(row["workflow"], write=True),
        csrf=csrf_token(),
    ), status


@signed_in
@requires(Access.READ)
def show(execution_id: str, step_id: str) -> tuple[str, int]:
    """One approval's form."""
    return _form_page(_open(execution_id, step_id), {}, [], 200)


@signed_in
@requires(Access.OPERATE)
def decide(execution_id: str, step_id: str) -> BaseResponse | tuple[str, int]:
    """Approve (the form's values checked first) or reject; then back to the list."""
    row = _open(execution_id, step_id)
    require(row["workflow"], write=True)
    decision = "reject" if request.form.get("decision") == "reject" else "approve"
    values, problems = from_html(row["form"], request.form, "$.values")
    # Shown again as typed (the page's fields hold text), with each field's problem.
    typed = request.form.to_dict()
    if decision == "approve" and problems:
        return _form_page(row, typed, problems, 422)
    try:
        with connection() as conn:
            operate.decide_approval(conn, g.api_key, execution_id, step_id, decision, values)
    except FormValuesInvalid as refused:
        return _form_page(row, typed, refused.errors or [], 422)
    return redirect(url_for("console.approvals", decided=f"{execution_id}/{step_id}"), 303)


def install(bp: Blueprint) -> None:
    """Add the pages' routes to the console's blueprint."""
    bp.add_url_rule("/approvals", "approvals", page, methods=["GET"])
    path = "/approvals/<execution_id:execution_id>/<step_id>"
    bp.add_url_rule(path, "approval", show, methods=["GET"])
    bp.add_url_rule(path, "decide_approval", decide, methods=["POST"])
