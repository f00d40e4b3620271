"""Workflow definitions the tests publish again and again."""

from __future__ import annotations

from typing import Any

# One transform behind an unsigned webhook: the smallest workflow that makes executions.
OPEN: dict[str, Any] = {
    "name": "Open intake",
    "trigger": {"webhook": {"auth": "none"}},
    "steps": [{"id": "shape", "type": "transform", "output": {"x": "{{ input.x }}"}}],
}


def unsigned(steps: list[dict[str, Any]], name: str = "t") -> dict[str, Any]:
    """A definition with these steps behind an unsigned (auth "none") webhook."""
    return {"name": name, "trigger": {"webhook": {"auth": "none"}}, "steps": steps}
