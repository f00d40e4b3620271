"""Asserting RFC 9457 answers, shared by the API tests."""

from __future__ import annotations

from typing import Any

PROBLEM = "application/problem+json"

# What must never appear in an answer: a stack trace, a library's name, a server path.
LEAKS = ("Traceback", 'File "', "psycopg", "werkzeug", "/work/")


def assert_problem(response: Any, status: int | tuple[int, ...]) -> dict[str, Any]:
    """An RFC 9457 answer with the given status (or one of them), naming no internals."""
    statuses = (status,) if isinstance(status, int) else status
    text = response.get_data(as_text=True)
    assert response.status_code in statuses, text
    assert response.mimetype == PROBLEM, (response.mimetype, text[:200])
    body = response.get_json()
    assert {"type", "title", "status", "detail"} <= body.keys()
    assert body["status"] == response.status_code
    assert body["type"].startswith("urn:flowforge:problem:")
    for leak in LEAKS:
        assert leak not in text
    return body
