"""The CLI at a person's terminal: the completion script generated from the parser
completes commands, options and choices in a real bash; long output goes through the
pager only on a terminal (never into a pipe, never with --no-pager)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from flowforge import cli


def _complete(*words: str) -> list[str]:
    """What bash offers after `words` (the last one is being typed), with the script
    `flowforge completion bash` prints loaded."""
    script = cli.completion_script("bash")
    line = " ".join(f"'{w}'" for w in words)
    probe = (
        f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
        '_flowforge; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completes_commands_options_and_choices_from_the_parser() -> None:
    assert "executions" in _complete("flowforge", "") and "cancel-bulk" in _complete(
        "flowforge", ""
    )
    assert _complete("flowforge", "workflow", "pu") == ["publish"]
    assert _complete("flowforge", "executions", "list", "--st") == ["--status"]
    assert _complete("flowforge", "executions", "list", "--status", "need") == ["needs_attention"]
    assert _complete("flowforge", "--output", "j") == ["json"]
    assert _complete("flowforge", "completion", "") == ["bash", "zsh"]
    # Options before the command name do not lose the place.
    assert _complete("flowforge", "--no-pager", "schedule", "back") == ["backfill"]


def test_the_zsh_script_loads_the_same_completion_through_bashcompinit() -> None:
    zsh = cli.completion_script("zsh")
    assert zsh.startswith("# flowforge completion for zsh")
    assert "bashcompinit" in zsh and cli.completion_script("bash") in zsh
    assert subprocess.run(["bash", "-n", "-c", cli.completion_script("bash")]).returncode == 0


def test_completion_needs_neither_the_api_nor_the_database() -> None:
    env = {"PATH": os.environ["PATH"], "FLOWFORGE_DATABASE_URL": "postgresql://127.0.0.1:1/x"}
    done = subprocess.run(
        [sys.executable, "-m", "flowforge", "completion", "bash"]
        if Path("flowforge/__main__.py").exists()
        else [str(Path(sys.executable).parent / "flowforge"), "completion", "bash"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "complete -o default -F _flowforge flowforge" in done.stdout


EMIT = """
import argparse, sys
from flowforge.cli import output
args = argparse.Namespace(format="table", no_pager=sys.argv[1] == "off")
output.emit(args, None, "\\n".join(f"line {n}" for n in range(200)))
"""


def _on_a_terminal(tmp_path: Path, *, pager: str, no_pager: bool = False) -> tuple[str, str]:
    """Run _emit with stdin and stdout on a pseudo-terminal of 24 lines; what reached
    the terminal, and what the pager (it writes to a file) got."""
    primary, secondary = pty.openpty()
    paged = tmp_path / "paged.txt"
    env = {
        **os.environ,
        "FLOWFORGE_PAGER": pager.format(out=paged),
        "LINES": "24",
        "COLUMNS": "80",
    }
    child = subprocess.Popen(
        [sys.executable, "-c", EMIT, "off" if no_pager else "on"],
        stdin=secondary,
        stdout=secondary,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    assert child.wait(timeout=30) == 0, child.stderr.read() if child.stderr else ""
    os.close(primary)
    return seen.decode(), paged.read_text() if paged.exists() else ""


def test_long_output_is_paged_on_a_terminal_only(tmp_path: Path) -> None:
    pager = "sed 's/^/paged: /' > {out}"
    seen, paged = _on_a_terminal(tmp_path, pager=pager)
    assert "line 0" not in seen and paged.splitlines()[0] == "paged: line 0"
    assert paged.splitlines()[-1] == "paged: line 199"

    (tmp_path / "paged.txt").unlink()
    seen, paged = _on_a_terminal(tmp_path, pager=pager, no_pager=True)
    assert "line 199" in seen and paged == ""

    # Into a pipe: never paged.
    env = {**os.environ, "FLOWFORGE_PAGER": f"cat > {tmp_path / 'paged.txt'}"}
    done = subprocess.run(
        [sys.executable, "-c", EMIT, "on"], capture_output=True, text=True, env=env, timeout=30
    )
    assert done.stdout.count("line ") == 200 and not (tmp_path / "paged.txt").exists()
