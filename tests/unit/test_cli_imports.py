"""The `flowforge` command imports only what the command run needs (issue 43: a person
runs it dozens of times an hour, and completion runs it on every Tab): `--help` and
completion load none of flask, psycopg, requests, pika; a remote command never loads the
database driver. Checked as imports in a fresh interpreter, not as timings (the timings
are tests/bench/cli.py's figures)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from flowforge.cli import build_parser
from flowforge.cli.run import handler
from tests.support.processes import free_port

HEAVY = ("flask", "psycopg", "requests", "pika", "jsonschema", "flowforge.domain.definitions")

PROBE = """
import json, sys
from flowforge.cli import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def loaded_by(argv: list[str], env: dict[str, str] | None = None) -> set[str]:
    """The modules a fresh interpreter holds after running `flowforge ARGV` in-process."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    return set(json.loads(done.stderr.splitlines()[-1]))


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if any(m == h or m.startswith(f"{h}.") for h in HEAVY)}


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["executions", "list", "--help"], ["completion", "bash"], ["--version"]],
)
def test_help_and_completion_import_no_client_driver_or_web_framework(argv: list[str]) -> None:
    modules = loaded_by(argv)
    assert "flowforge.cli.parser" in modules  # the probe did run the CLI
    assert heavy(modules) == set()


def test_a_remote_command_never_loads_the_database_driver() -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "FLOWFORGE_API_URL": f"http://127.0.0.1:{free_port()}",  # nothing listens
        "FLOWFORGE_API_KEY": "ffk_unused",
    }
    modules = loaded_by(["executions", "list"], env)
    assert "requests" in modules and "flowforge.cli.executions" in modules
    assert not {m for m in modules if m == "psycopg" or m.startswith(("psycopg.", "flask"))}


def _handlers(parser: argparse.ArgumentParser) -> list[str]:
    found = [parser.get_default("handler")] if parser.get_default("handler") else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += _handlers(child)
    return found


def test_every_command_names_a_handler_that_exists() -> None:
    names = _handlers(build_parser())
    assert len(names) > 30  # every command of the tree, not an empty walk
    for name in names:
        assert callable(handler(name)), name
