"""The generated reference pages match the code: docs/reference/configuration.md lists
every FLOWFORGE_* variable the code reads, and docs/reference/cli.md every command's
--help. When one fails, run `python -m flowforge.cli.reference` and commit the pages."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from flowforge.cli import reference
from flowforge.store.config import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
# The programs FlowForge ships; tests and benchmarks have settings of their own.
SOURCES = [
    *sorted((ROOT / "flowforge").rglob("*.py")),
    *(ROOT / "bin" / n for n in ("api", "worker", "migrate")),
]
NAME = re.compile(r"FLOWFORGE_[A-Z0-9_]*[A-Z0-9]")


def test_every_variable_the_code_reads_is_documented() -> None:
    documented = {v.name for v in VARIABLES}
    prefixes = tuple(n.split("<")[0] for n in documented if "<" in n)
    used = {name for path in SOURCES for name in NAME.findall(path.read_text(encoding="utf-8"))}
    missing = sorted(n for n in used if n not in documented and not f"{n}_".startswith(prefixes))
    assert missing == [], f"add a Variable to flowforge/store/config.py VARIABLES for {missing}"


def test_the_configuration_page_is_generated_from_the_code() -> None:
    assert reference.CONFIGURATION.read_text(encoding="utf-8") == reference.configuration_page()


def test_the_cli_page_is_generated_from_the_parser() -> None:
    assert reference.CLI.read_text(encoding="utf-8") == reference.cli_page()


def test_every_command_has_an_example_and_described_arguments() -> None:
    from flowforge.cli import build_parser

    for path, parser in reference._commands(build_parser()):
        if not path:
            continue
        text = parser.format_help()
        assert "example" in text, f"flowforge {' '.join(path)} --help has no example"
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if not action.option_strings and action.help is None:
                raise AssertionError(f"flowforge {' '.join(path)}: {action.dest} undescribed")
