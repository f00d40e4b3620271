"""Every execution is inserted through one builder, store/creation.py (issue 40 item 4),
and that builder composes its statements with psycopg.sql instead of splicing f-strings:
a second INSERT INTO executions drifts from the first (a column, a status, a wake-up
forgotten), and an f-string is one step from user input in SQL."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import flowforge

ROOT = Path(flowforge.__file__).parent
BUILDER = ROOT / "store" / "creation.py"
INSERT = re.compile(r"INSERT\s+INTO\s+executions\b", re.IGNORECASE)


def test_only_the_builder_inserts_executions() -> None:
    others = [
        str(path.relative_to(ROOT))
        for path in sorted(ROOT.rglob("*.py"))
        if path != BUILDER and INSERT.search(path.read_text())
    ]
    assert others == [], "insert executions through flowforge/store/creation.py"
    assert INSERT.search(BUILDER.read_text())


def test_the_builder_splices_no_f_strings() -> None:
    tree = ast.parse(BUILDER.read_text())
    spliced = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)]
    assert spliced == [], f"f-strings at lines {spliced}: compose with psycopg.sql"
