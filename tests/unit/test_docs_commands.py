"""Every `flowforge …` command in a code block of the README and of every docs page is
one the real parser accepts (issue 43: the debounce how-to showed `workflow publish sync
sync.json`, which fails). The tutorial also runs its blocks end to end
(tests/e2e/test_tutorial.py); this covers every other page, without a server: a command
that parses is one whose words, options and argument values are right.

docs/reference/cli.md is generated from the parser itself and left out."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from flowforge.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *(p for p in sorted((ROOT / "docs").rglob("*.md")) if p.name != "cli.md"),
]
BLOCK = re.compile(r"^```[a-z]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# `flowforge` where a shell runs it: a line's first word, inside $( ), after until, or
# as the command of `docker compose exec -T api` — not an argument (`ruff check flowforge`).
COMMAND = re.compile(r"(?:^\s*|\$\(|\buntil\s+|\bexec -T api\s+)flowforge\s+(.*)")
# Where the command ends: a pipe, a list, a subshell's end, a comment.
OPERATORS = frozenset({"|", "||", "&&", ";", ")", "&"})
# What the shell variables of the pages stand for when they are run.
VARIABLES = {
    "$ID": "01a233ee-a3de-71f1-8ccd-4191093a47ad",
    "$1": "01a233ee-a3de-71f1-8ccd-4191093a47ad",
}


def commands(page: Path) -> list[tuple[str, bool]]:
    """The argument lists of the page's `flowforge` commands, continuation lines joined,
    each with whether it is shown failing on purpose (`… || echo "exit $?"`)."""
    found = []
    for block in BLOCK.findall(page.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            if line.lstrip().startswith("# ") or not (match := COMMAND.search(line)):
                continue
            lexer = shlex.shlex(match.group(1), posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            words, then = [], None
            for word in lexer:
                if word in OPERATORS:
                    then = word
                    break
                words.append(VARIABLES.get(word, word))
            found.append((shlex.join(words), then == "||"))
    return found


FOUND = [(page.relative_to(ROOT), *command) for page in PAGES for command in commands(page)]


def test_the_pages_have_commands_to_check() -> None:
    assert len(FOUND) > 30
    assert any("debounce-and-batch" in str(page) for page, _, _ in FOUND)


@pytest.mark.parametrize(
    ("page", "command", "failing"), FOUND, ids=[f"{p}: {c}" for p, c, _ in FOUND]
)
def test_every_documented_command_parses(page: Path, command: str, failing: bool) -> None:
    errors, code = io.StringIO(), 0
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(shlex.split(command))
    except SystemExit as exc:
        code = int(exc.code or 0)  # `--help` exits 0
    if failing:  # shown as a usage error on purpose: it must still be one
        assert code == 2, f"{page}: flowforge {command} is shown failing, but parses"
    elif code:
        raise AssertionError(f"{page}: flowforge {command}\n{errors.getvalue()}")


def test_a_wrong_command_is_caught() -> None:
    page = ROOT / "wrong.md"
    text = "```sh\nflowforge workflow publish sync sync.json\nruff check flowforge tests\n```\n"
    try:
        page.write_text(text)
        assert commands(page) == [("workflow publish sync sync.json", False)]
    finally:
        page.unlink()
    with pytest.raises(AssertionError, match="unrecognized arguments"):
        test_every_documented_command_parses(page, "workflow publish sync sync.json", False)
