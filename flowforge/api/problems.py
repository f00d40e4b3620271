"""RFC 9457 problem details: the only shape an error leaves the API in."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify
from gunicorn.http.errors import NoMoreData, ParseException
from werkzeug.exceptions import HTTPException

from flowforge.errors import ClientError, InvalidParameter, Unavailable

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"


class Problem(Exception):
    """An error answer raised from a view; rendered by the handler below."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        slug: str | None = None,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        extensions: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.extensions = extensions or {}
        self.status = status
        self.title = title
        self.detail = detail
        self.slug = slug or title.lower().replace(" ", "-")
        self.errors = errors
        self.headers = headers or {}


def problem_document(
    status: int, title: str, detail: str, slug: str | None = None
) -> dict[str, Any]:
    """The RFC 9457 body; also written by gunicorn's worker for errors Flask never sees."""
    return {
        "type": f"urn:flowforge:problem:{slug or title.lower().replace(' ', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
    }


def problem_response(problem: Problem) -> Response:
    """Render a Problem as application/problem+json."""
    body = problem_document(problem.status, problem.title, problem.detail, problem.slug)
    if problem.errors is not None:
        body["errors"] = problem.errors
    body.update(problem.extensions)
    response = jsonify(body)
    response.status_code = problem.status
    response.mimetype = PROBLEM_JSON
    for name, value in problem.headers.items():
        response.headers[name] = value
    return response


def client_problem(exc: ClientError) -> Problem:
    """The problem document a ClientError leaves as: its status, title, detail and the
    JSON paths of what was wrong."""
    return Problem(exc.status, exc.title, exc.detail, errors=exc.errors, extensions=exc.extensions)


def install(app: Flask) -> None:
    """Map every error, expected or not, to problem details without a stack trace."""

    @app.errorhandler(Problem)
    def _problem(exc: Problem) -> Response:
        return problem_response(exc)

    @app.errorhandler(ClientError)
    def _client(exc: ClientError) -> Response:
        return problem_response(client_problem(exc))

    @app.errorhandler(Unavailable)
    def _unavailable(exc: Unavailable) -> Response:
        # The message may name internals (hosts, key ids): it goes to the log, not the caller.
        if exc.retry_after is None:
            logger.error("%s", exc)  # the operator must act; waiting will not help
            headers: dict[str, str] = {}
        else:
            logger.warning("%s: %s", type(exc).__name__, exc)
            headers = {"Retry-After": str(exc.retry_after)}
        return problem_response(Problem(exc.status, exc.title, exc.detail, headers=headers))

    @app.errorhandler(ParseException)
    @app.errorhandler(NoMoreData)
    def _framing(exc: Exception) -> Response:
        # gunicorn reads a chunked body lazily, so broken framing surfaces in the view.
        logger.info("malformed request body", extra={"error": type(exc).__name__})
        return problem_response(
            client_problem(
                InvalidParameter(
                    "Malformed request body",
                    "the body's framing is broken (chunked encoding or Content-Length)",
                )
            )
        )

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> Response:
        status = exc.code or 500
        title = exc.name or "Error"
        detail = {
            404: "no such resource",
            405: "method not allowed on this resource",
            413: "the request body is larger than FLOWFORGE_MAX_BODY_BYTES",
        }.get(status, exc.description or title)
        response = problem_response(Problem(status, title, detail))
        if status == 405 and exc.get_response().headers.get("Allow"):
            response.headers["Allow"] = exc.get_response().headers["Allow"]
        return response

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        logger.exception("unhandled error")
        return problem_response(
            Problem(500, "Internal server error", "an unexpected error occurred; it was logged")
        )
