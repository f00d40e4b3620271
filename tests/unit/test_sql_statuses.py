"""Every status a statement of flowforge/ spells is a word of the domain (domain/model.py),
and a set of statuses is written by `model.sql_list` from the enum, never by hand: a
renamed or removed status then fails here instead of matching no row in production."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from flowforge.domain.model import (
    CircuitState,
    DeliveryStatus,
    ExecutionStatus,
    FailureGroupStatus,
    GroupStatus,
    ItemStatus,
    StepStatus,
)

PACKAGE = Path(__file__).resolve().parents[2] / "flowforge"
# The closed sets a `status` column holds: executions, steps, map items, intake groups,
# circuits, notification messages, failure groups.
STATUS_ENUMS = (
    ExecutionStatus,
    StepStatus,
    ItemStatus,
    GroupStatus,
    CircuitState,
    DeliveryStatus,
    FailureGroupStatus,
)
# store/runs.py spells three sets by hand; it is being split (load_run asks each step kind
# what it needs) on another branch, which takes its statements through sql_list. Its
# literals are still checked for membership below.
HAND_WRITTEN_SETS_LEFT = frozenset({"store/runs.py"})

STATUS = r"\b(?:\w+\.)?status"
QUOTED = r"'[^']*'"
IN_LIST = re.compile(rf"{STATUS}\s+(?:NOT\s+)?IN\s*\(\s*({QUOTED}(?:\s*,\s*{QUOTED})*)\s*\)", re.I)
COMPARED = re.compile(rf"{STATUS}\s*(?:=|<>|!=)\s*({QUOTED})", re.I)


def _sql_texts(path: Path) -> list[str]:
    """Every string literal of a module, and every literal part of its f-strings (what
    sql_list renders is a formatted value, so it is never read here)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append(node.value)
    return found


MODULES = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))


def _words(listed: str) -> list[str]:
    return [word.strip().strip("'") for word in listed.split(",")]


def test_the_patterns_find_what_they_look_for() -> None:
    """The scan reads the statements it is meant to: a hand-written set, a comparison."""
    sql = "WHERE e.status IN ('queued', 'paused') AND s.status = 'ready'"
    assert [_words(m) for m in IN_LIST.findall(sql)] == [["queued", "paused"]]
    assert COMPARED.findall(sql) == ["'ready'"]


@pytest.mark.parametrize("module", MODULES)
def test_every_status_in_sql_is_a_member_of_its_enum(module: str) -> None:
    for text in _sql_texts(PACKAGE / module):
        for listed in IN_LIST.findall(text):
            words = set(_words(listed))
            homes = [enum for enum in STATUS_ENUMS if words <= {m.value for m in enum}]
            assert homes, f"{module}: status set {sorted(words)} is no enum's"
        for quoted in COMPARED.findall(text):
            word = quoted.strip("'")
            assert any(word in {m.value for m in enum} for enum in STATUS_ENUMS), (
                f"{module}: status {word!r} is no enum's"
            )


@pytest.mark.parametrize("module", sorted(set(MODULES) - HAND_WRITTEN_SETS_LEFT))
def test_status_sets_are_written_by_sql_list(module: str) -> None:
    hand_written = [m for text in _sql_texts(PACKAGE / module) for m in IN_LIST.findall(text)]
    assert not hand_written, f"{module}: write {hand_written} with model.sql_list"
