"""Workflow definitions the tests publish again and again."""

from __future__ import annotations

from typing import Any

# One transform behind an unsigned webhook: the smallest workflow that makes executions.
OPEN: dict[str, Any] = {
    "name": "Open intake",
    "trigger": {"webhook": {"auth": "none"}},
    "steps": [{"id": "shape", "type": "transform", "output": {"x": "{{ input.x }}"}}],
}

# Two http_request steps, a GET then a POST, to port 9 of the loopback (nothing listens):
# the worker components' tests and the relay's drive them by hand.
CALLS: dict[str, Any] = {
    "name": "calls",
    "trigger": {"webhook": {"auth": "none"}},
    "steps": [
        {"id": "fetch", "type": "http_request", "request": {"url": "http://127.0.0.1:9/f"}},
        {
            "id": "charge",
            "type": "http_request",
            "request": {"method": "POST", "url": "http://127.0.0.1:9/c"},
        },
    ],
}


def unsigned(steps: list[dict[str, Any]], name: str = "t") -> dict[str, Any]:
    """A definition with these steps behind an unsigned (auth "none") webhook."""
    return {"name": name, "trigger": {"webhook": {"auth": "none"}}, "steps": steps}
