"""The console's definition editor under /ui/workflows/KEY/edit (docs/reference/console.md):
a draft checked by the dry-run publish (flowforge/api/drafts.py) as you type, its DAG and
its diff against the newest version drawn by the server, and a publish that needs a
confirmation. Without JavaScript, "Check" posts the form and the page comes back with the
same answer; with it, the console's script posts the draft as you type and swaps in the
fragment the server rendered."""

from __future__ import annotations

import json
from typing import Any

from flask import current_app, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from flowforge.api.auth import requires
from flowforge.api.console import graph, operate
from flowforge.api.console.session import require, signed_in
from flowforge.api.console.site import bp, csrf_token
from flowforge.api.drafts import check_draft
from flowforge.api.pool import connection
from flowforge.domain import defdiff
from flowforge.domain.definitions import DefinitionInvalid
from flowforge.domain.roles import Access
from flowforge.errors import ClientError, InvalidParameter, NotFound
from flowforge.store import catalog

# What a new workflow's editor starts with: the smallest valid definition.
SKELETON = {
    "name": "New workflow",
    "trigger": {"webhook": {"auth": "none"}},
    "steps": [{"id": "first", "type": "transform", "output": {"received": "{{ input }}"}}],
}


def _checked(key: str, text: str) -> dict[str, Any]:
    """The fragment's values: the draft's problems (each with its JSON path), or its DAG,
    its diff against the newest version and the version publishing it would make."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        return {"problems": [{"path": "$", "message": f"not JSON: {exc}"}]}
    try:
        with connection() as conn:
            found = check_draft(conn, key, document, g.api_key)
    except DefinitionInvalid as exc:
        return {"problems": exc.errors}
    except ClientError as exc:
        return {"problems": [{"path": "$", "message": exc.detail}]}
    newest = found["newest_version"]
    changes = defdiff.Diff([(c[0], c[1], c[2]) for c in found["changes"]])
    return {
        "problems": [],
        "dag": graph.layout(found["steps"], {}),
        "box": {"w": graph.BOX_W, "h": graph.BOX_H},
        "diff": changes.lines(f"version {newest}", "draft") if newest else [],
        "newest": newest,
        "unchanged": newest is not None and not found["changes"],
    }


@bp.get("/workflows/<workflow_key:key>/edit")
@signed_in
@requires(Access.ADMINISTER)
def edit(key: str) -> str:
    """The editor, with the newest version's definition (or a skeleton) as the draft."""
    require(key, write=True)
    try:
        with connection() as conn:
            newest = catalog.get_workflow(conn, key)["latest_version"]
            document: Any = catalog.get_version(conn, key, newest)["definition"]
    except NotFound:
        document = SKELETON
    return _editor_page(key, json.dumps(document, indent=2, ensure_ascii=False))


@bp.post("/workflows/<workflow_key:key>/edit")
@signed_in
@requires(Access.ADMINISTER)
def check_page(key: str) -> str:
    """The editor's "Check" without JavaScript: the page again, with the answer."""
    require(key, write=True)
    return _editor_page(key, request.form.get("draft", ""))


def _editor_page(key: str, text: str) -> str:
    """The editor with `text` in it and its check's answer: the page opens with the newest
    version and comes back, without JavaScript, with what the author checked."""
    return render_template(
        "editor.html", key=key, draft=text, csrf=csrf_token(), **_checked(key, text)
    )


@bp.post("/workflows/<workflow_key:key>/check")
@signed_in
@requires(Access.ADMINISTER)
def check_fragment(key: str) -> str:
    """The answer alone, for the script to swap in as the author types."""
    require(key, write=True)
    text = request.form.get("draft", "")
    return render_template("_draft_check.html", key=key, csrf=csrf_token(), **_checked(key, text))


@bp.post("/workflows/<workflow_key:key>/publish")
@signed_in
@requires(Access.ADMINISTER)
def publish(key: str) -> BaseResponse | str:
    """Publish the draft, only when the confirmation is ticked and the checker passes it
    (the same checks as the API's publish); then the new version's page."""
    api_key = require(key, write=True)
    text = request.form.get("draft", "")
    if request.form.get("confirm") != "yes":
        raise InvalidParameter("Not confirmed", "tick the confirmation to publish the draft")
    checked = _checked(key, text)
    if checked["problems"]:
        return render_template("editor.html", key=key, draft=text, csrf=csrf_token(), **checked)
    document = json.loads(text)
    bindings = current_app.extensions["flowforge.settings"].secret_bindings
    definition = catalog.publishable(
        key, document, bindings, may_use_secrets=api_key.publish_secrets
    )
    with connection() as conn:
        published = operate.publish(conn, api_key, key, document, definition)
    return redirect(url_for("console.workflow", key=key, version=published["version"]), 303)
