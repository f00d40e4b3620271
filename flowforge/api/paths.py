"""URL converters for the identifiers in paths, checked while routing, and the one check
of every request's text.

A path segment that is no identifier is answered before authentication and before the
view runs, as each route has always answered it: the converter of a rule says how. Text
PostgreSQL cannot store (a NUL, a lone surrogate) in any path parameter, query parameter
or console form field of any route is a 400 before the view runs (docs/reference/
http-api.md, errors): one rule for every route, old and new, instead of one per view.
"""

from __future__ import annotations

import uuid
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import BaseConverter, Map, ValidationError

from flowforge.api.problems import client_problem, problem_response
from flowforge.domain import definitions
from flowforge.domain.jsonvalues import storable_text
from flowforge.domain.model import is_key
from flowforge.domain.operations import Action, Kind
from flowforge.errors import ClientError, NotFound

_KEY_RULE = "workflow keys are 1-64 of a-z, 0-9, '-' and '_'"


def action_step(action: Action, step_id: str | None) -> list[str]:
    """The step a declared action acts on, as the first of its values (none for an action
    on the whole execution); 404 when the path names no step of the kind it takes (a map
    item's step only where it says so). Checked in the view, after authentication."""
    step = action.step
    if step is None:
        return []
    is_step = definitions.is_step_row if step.kind is Kind.STEP_ROW else definitions.is_step_id
    if step_id is None or not is_step(step_id):
        raise NotFound("no such step")
    return [step_id]


class KeyInvalid(ClientError):
    """Publishing names a workflow that need not exist yet: the key itself is invalid."""

    status = 422
    title = "Invalid workflow key"
    errors = [{"path": "key", "message": "invalid workflow key"}]


class PathRefused(HTTPException):
    """Routing found the rule, but a path segment is not the identifier it names: the
    error it stands for leaves as every ClientError does (werkzeug's routing lets only an
    HTTPException through, so this carries it)."""

    def __init__(self, error: ClientError) -> None:
        super().__init__(error.detail)
        self.code = error.status
        self.error = error


class TextUnstorable(ClientError):
    """A request parameter holds text that PostgreSQL cannot store."""

    title = "Unsupported text"


def _refuse_unstorable_text() -> None:
    """Raise TextUnstorable for a NUL or a lone surrogate in a path parameter, a query
    parameter (name or value) or a console form field. Webhook and API bodies are JSON,
    judged by jsonvalues.loads_storable; the form is read only where forms are taken
    (the console), so no other body is consumed here."""
    found = [("path parameter", name, value) for name, value in (request.view_args or {}).items()]
    found += [("query parameter", name, value) for name, value in request.args.items(multi=True)]
    if request.blueprint == "console" and request.method == "POST":
        found += [("form field", name, value) for name, value in request.form.items(multi=True)]
    for kind, name, value in found:
        if not storable_text(name) or (isinstance(value, str) and not storable_text(value)):
            shown = repr(name) if storable_text(name) else "a parameter"
            raise TextUnstorable(f"the {kind} {shown} holds a NUL or an unpaired surrogate")


def _key_refusal(answer: str, value: str) -> ClientError:
    if answer == "hook":
        return NotFound(f"no workflow {value!r}")
    if answer == "publish":
        return KeyInvalid(f"{_KEY_RULE}, starting with a letter or digit")
    return NotFound(_KEY_RULE)


class WorkflowKey(BaseConverter):
    """`<workflow_key:key>`: a whole workflow key (model.is_key, a full match).

    `answer` picks the refusal: "resource" (404), "hook" (404 naming the key) or
    "publish" (422 with the JSON path)."""

    def __init__(self, url_map: Map, answer: str = "resource") -> None:
        super().__init__(url_map)
        self.answer = answer

    def to_python(self, value: str) -> str:
        if not is_key(value):
            raise PathRefused(_key_refusal(self.answer, value))
        return value


class ExecutionId(BaseConverter):
    """`<execution_id:execution_id>`: a UUID, in its canonical spelling.

    Only hex digits and hyphens match the rule, so a word such as `replay` is no execution
    id: GET /api/v1/executions/replay is POST /replay's path asked with the wrong method
    (405, and `Allow` lists POST alone), as /openapi.json describes it."""

    regex = "[0-9A-Fa-f-]+"

    def to_python(self, value: str) -> str:
        try:
            return str(uuid.UUID(value))
        except ValueError:
            raise ValidationError() from None

    def to_url(self, value: Any) -> str:
        return str(value)


def install(app: Flask) -> None:
    """Register the converters (before the blueprints) and their answer."""
    app.url_map.converters["workflow_key"] = WorkflowKey
    app.url_map.converters["execution_id"] = ExecutionId
    app.before_request(_refuse_unstorable_text)

    @app.errorhandler(PathRefused)
    def _refused(exc: PathRefused) -> Response:
        return problem_response(client_problem(exc.error))
