"""Asserting RFC 9457 answers, shared by the API tests."""

from __future__ import annotations

from typing import Any

PROBLEM = "application/problem+json"


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    """An RFC 9457 answer with the given status, and no stack trace."""
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == PROBLEM
    body = response.get_json()
    assert {"type", "title", "status", "detail"} <= body.keys()
    assert body["status"] == status
    assert "Traceback" not in response.get_data(as_text=True)
    return body
