"""The `flowforge` CLI refuses bad arguments before it connects anywhere: one line on
stderr, exit code 2, never a traceback; tables line up under their headers."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge import cli
from flowforge.cli.tables import table
from tests.support.processes import free_port

EID = "01a2319b-39f6-785c-973d-591e2442266d"


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """main(argv) as the console script runs it: an argparse exit counts as its code."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def remote_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remote mode with a key, so nothing here reaches for a database."""
    monkeypatch.setenv("FLOWFORGE_API_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("FLOWFORGE_API_KEY", "ff_" + "0" * 64)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["executions", "show", "nope"], "'nope' is not an execution id (a UUID)"),
        (["cancel", "12"], "'12' is not an execution id"),
        (["executions", "list", "--limit", "0"], "--limit: 0 must be 1 or more"),
        (["executions", "list", "--limit", "201"], "--limit: 201 is more than 200"),
        (["executions", "list", "--limit", "x"], "--limit: 'x' is not a whole number"),
        (["executions", "list", "--status", "done"], "--status: invalid choice: 'done'"),
        (["executions", "list", "--workflow", "Bad Key"], "is not a workflow key"),
        (["resolve", EID, "charge", "succeeded", "{bad"], "argument OUTPUT: not JSON"),
        (["resolve", EID, "charge", "maybe"], "invalid choice: 'maybe'"),
        (["complete", EID, "no such step!"], "is not a step id"),
        (["executions", "list", "--output", "yaml"], "--output: invalid choice: 'yaml'"),
        (["--api", "ftp://host", "executions", "list"], "is not an http:// or https:// URL"),
        (["secret", "revoke", "orders", "-1"], "must be 1 or more"),
        ([], "the following arguments are required: COMMAND"),
        (["executions"], "the following arguments are required: ACTION"),
        (["--api", "http://127.0.0.1:1", "--db", "retry", EID], "--api and --db exclude"),
        (["apikey", "list"], "`flowforge apikey` has no API endpoint"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(capsys: Any, argv: list[str], says: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert says in err


def test_a_missing_key_is_a_usage_error(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWFORGE_API_KEY")
    code, _, err = run(capsys, "executions", "list")
    assert code == 2 and err.startswith("error: usage: FLOWFORGE_API_KEY is not set")


def test_an_api_that_does_not_answer_is_one_line_and_exit_1(capsys: Any) -> None:
    code, out, err = run(capsys, "executions", "list", "--output", "json")
    assert code == 1 and out == ""
    assert (
        err.splitlines() == [err.strip()]
        and "cannot connect to the API at http://127.0.0.1:" in err
    )
    assert "connection refused" in err


def test_version_and_help(capsys: Any) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("flowforge ")
    code, out, _ = run(capsys, "executions", "list", "--help")
    assert code == 0 and "--limit" in out and "--output" in out and "--api" in out


def test_table_columns_line_up_under_their_headers() -> None:
    rows = [{"id": 1, "name": "a much longer name", "seen": None}, {"id": 12345, "name": "b"}]
    text = table(rows, [("ID", "id"), ("NAME", "name"), ("SEEN", "seen")])
    assert text.splitlines() == [
        "ID     NAME                SEEN",
        "1      a much longer name  -",
        "12345  b                   -",
    ]
    assert table([], [("ID", "id"), ("NAME", "name")]) == "ID  NAME"
