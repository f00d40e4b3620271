"""The import picture of docs/architecture.md, checked on the source: a module that imports
across a line the document draws, or a module the document does not place, fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "flowforge"

# The layers of docs/architecture.md, lowest first; a module may import its own layer and
# the layers below it.
LAYERS: dict[str, set[str]] = {
    "foundation": {
        "errors",
        "model",
        "jsonvalues",
        "cache",
        "outbox",
        "faults",
        "logs",
        "launcher",
        "tables",
    },
    "rules": {"templating", "cron", "inputschema", "definitions", "engine", "defdiff"},
    "persistence": {
        "db",
        "runs",
        "catalog",
        "intake",
        "presets",
        "sources",
        "archive",
        "reingest",
        "actions",
        "timeline",
        "apikeys",
        "sealing",
        "signatures",
        "secret_bindings",
        "metrics",
        "migrate",
        "config",
        "hints",
        "waits",
        "resumes",
        "flowcontrol",
        "pausing",
        "replay",
        "outbound",
        "timelimits",
        "search",
        "sessions",
        "schedules",
        "direct",
        "tracing",
        "budget",
        "failover",
        "attention",
    },
    "outside world": {"netguard", "http_step", "apiclient"},
    "entry points": {"api", "worker", "cli"},
}
RANK = {layer: rank for rank, layer in enumerate(LAYERS)}
IO_LIBRARIES = {"psycopg", "psycopg_pool", "pika", "requests", "urllib3", "flask", "gunicorn"}


def _part(module: str) -> str:
    """`flowforge.worker.relay` → `worker`; `flowforge.engine` → `engine`."""
    return module.split(".")[1]


def _layer(module: str) -> str:
    part = _part(module)
    for layer, parts in LAYERS.items():
        if part in parts:
            return layer
    raise AssertionError(f"{module} is in no layer of docs/architecture.md: place it there")


def _modules() -> list[str]:
    return sorted(
        ".".join(("flowforge", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
            ".__init__"
        )
        for path in PACKAGE.rglob("*.py")
    )


def _imports(module: str) -> set[str]:
    """Every module this one imports, absolute names; `from flowforge import x` counts as
    importing flowforge.x."""
    relative = module.removeprefix("flowforge").lstrip(".").replace(".", "/")
    path = PACKAGE / f"{relative}.py" if relative else PACKAGE / "__init__.py"
    if not path.exists():
        path = PACKAGE / relative / "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "flowforge":
                found.update(f"flowforge.{alias.name}" for alias in node.names)
    return found


MODULES = [m for m in _modules() if m != "flowforge"]


@pytest.mark.parametrize("module", MODULES)
def test_imports_follow_the_layers(module: str) -> None:
    layer = _layer(module)
    for imported in _imports(module):
        if not imported.startswith("flowforge."):
            continue
        target = _layer(imported)
        assert RANK[target] <= RANK[layer], f"{module} ({layer}) imports {imported} ({target})"
        if layer == "foundation":
            assert _part(imported) in {"errors", _part(module)}, (
                f"{module} is foundation and may import only flowforge.errors, not {imported}"
            )


@pytest.mark.parametrize("module", [m for m in MODULES if _layer(m) in {"foundation", "rules"}])
def test_the_rules_import_no_io_library(module: str) -> None:
    io = {name for name in _imports(module) if name.split(".")[0] in IO_LIBRARIES}
    assert not io, f"{module} imports {sorted(io)}"


@pytest.mark.parametrize("module", [m for m in MODULES if _layer(m) == "entry points"])
def test_entry_points_do_not_import_each_other(module: str) -> None:
    own = _part(module)
    for imported in _imports(module):
        if imported.startswith("flowforge.") and _layer(imported) == "entry points":
            assert _part(imported) == own, f"{module} imports {imported}"


@pytest.mark.parametrize("module", [m for m in MODULES if _part(m) == "api"])
def test_the_api_never_talks_to_rabbitmq(module: str) -> None:
    assert not {name for name in _imports(module) if name.split(".")[0] == "pika"}


def test_the_layers_name_every_part_once() -> None:
    parts = [part for parts in LAYERS.values() for part in parts]
    assert len(parts) == len(set(parts))
    assert {_part(m) for m in MODULES} == set(parts)
