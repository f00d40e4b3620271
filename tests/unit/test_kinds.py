"""The step kinds behind the engine's core (flowforge/domain/kinds/, docs/architecture.md's
"The engine"): one per step type, each where the core looks for it, and each below
definitions.py in the import chain."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

from flowforge.domain import kinds
from flowforge.domain.engine import KINDS, PURE_TYPES
from flowforge.domain.model import StepType

KINDS_DIR = Path(kinds.__file__).parent
KIND_MODULES = sorted(
    info.name for info in pkgutil.iter_modules([str(KINDS_DIR)]) if info.name != "base"
)


def test_every_step_type_has_one_kind_in_a_module_of_its_name() -> None:
    assert set(KINDS) == set(StepType)
    for step_type, kind in KINDS.items():
        assert kind.type == step_type
        assert type(kind).__module__ == f"flowforge.domain.kinds.{step_type}"
    assert sorted(StepType) == KIND_MODULES


def test_only_the_http_request_leaves_the_process() -> None:
    assert set(StepType) - {StepType.HTTP_REQUEST} == PURE_TYPES


def test_a_kind_reaches_the_definitions_rules_through_the_run_only() -> None:
    """A kind imported definitions.py at run time would sit above it, and the engine that
    imports every kind one module further up the longest import chain."""
    for name in [*KIND_MODULES, "base"]:
        tree = ast.parse((KINDS_DIR / f"{name}.py").read_text())
        runtime = [node for node in tree.body if not isinstance(node, ast.If)]
        imported = {
            node.module
            for top in runtime
            for node in ast.walk(top)
            if isinstance(node, ast.ImportFrom) and node.module
        }
        assert "flowforge.domain.definitions" not in imported, name
        assert "flowforge.domain.engine" not in imported, name
