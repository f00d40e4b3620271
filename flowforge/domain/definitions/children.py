"""A workflow step's own fields (docs/contract.md#child-workflows): the workflow it starts and
the child's input."""

from __future__ import annotations

from typing import Any

from flowforge.domain.definitions.checker import Checker
from flowforge.domain.model import WORKFLOW_KEY


class ChildSection(Checker):
    """`workflow` and `input`."""

    def child(self, raw: dict[str, Any], path: str, ancestors: frozenset[str]) -> dict[str, Any]:
        """Check a workflow step (docs/contract.md#child-workflows): the key of the workflow it
        starts, and the child's input (templates over what the step may read, no secrets: it is
        stored)."""
        key = raw.get("workflow")
        if not isinstance(key, str) or not WORKFLOW_KEY.fullmatch(key):
            self.error(
                f"{path}.workflow",
                "workflow is required: the key of the workflow to start (lowercase letters,"
                " digits, '_' and '-', at most 64)",
            )
            key = None
        child_input = raw.get("input", {})
        self.templates(child_input, f"{path}.input", ancestors, secrets=False)
        return {"workflow": key, "child_input": child_input}
