"""What a command prints: JSON for scripts, text for people (coloured on a terminal,
paged when long, its terminal controls escaped), warnings and errors on stderr."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from flowforge.cli.tables import to_json

# Statuses in colour, only for a person at a terminal: never into a pipe or a file, and
# never when NO_COLOR is set (https://no-color.org).
COLOURS = {
    "succeeded": "32",
    "failed": "31",
    "needs_attention": "33",
    "unknown": "33",
    "cancelled": "2",
}


def _colour() -> bool:
    return not os.environ.get("NO_COLOR") and sys.stdout.isatty()


def paint(text: str, status: str) -> str:
    """`text` in the colour of `status`, on a terminal with colour on."""
    code = COLOURS.get(status)
    if code is None or not _colour():
        return text
    return f"\033[{code}m{text}\033[0m"


# C0 and C1 controls but line feed and tab, and DEL: a value an attacker wrote (a URL
# template filled from a webhook, a workflow name) must not drive the terminal (OSC 52
# clipboard writes, erased lines, a fake status) in human-readable output (docs/contract.md,
# Security rules).
# On a terminal with colour on, the few colour sequences `paint` writes pass (they can only
# colour text); every other control is shown escaped.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_OWN_COLOURS = re.compile(
    "(\x1b\\[(?:0|"
    + "|".join(sorted(set(COLOURS.values())))
    + ")m)|([\x00-\x08\x0b-\x1f\x7f-\x9f])"
)


def printable(text: str) -> str:
    """The text with every terminal control shown as its escape (`\\x1b`), not obeyed."""
    if not _colour():
        return _CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
    return _OWN_COLOURS.sub(lambda match: match.group(1) or f"\\x{ord(match.group(2)):02x}", text)


def emit(args: argparse.Namespace, value: Any, text: str | Callable[[], str]) -> None:
    """Print `value` as JSON with --output json (already escaped), else the human text
    with its control characters escaped, through a pager when it is longer than the
    terminal (as git and gh do)."""
    if args.format == "json":
        print(to_json(value))
        return
    shown = printable(text if isinstance(text, str) else text())
    if not _paged(args, shown):
        print(shown)


# `less` as git runs it: quit if one screen is enough (F), keep colours (R), leave the
# text on the screen (X). $LESS, when set, wins.
PAGER_LESS = "FRX"


def _pager(args: argparse.Namespace) -> str | None:
    """The pager command for a person at a terminal: $FLOWFORGE_PAGER, else $PAGER,
    else less; none with --no-pager, into a pipe or a file, or when it is empty or cat."""
    if getattr(args, "no_pager", False) or not (sys.stdout.isatty() and sys.stdin.isatty()):
        return None
    chosen = os.environ.get("FLOWFORGE_PAGER", os.environ.get("PAGER", "less")).strip()
    return None if chosen in ("", "cat") else chosen


def _paged(args: argparse.Namespace, text: str) -> bool:
    """Show `text` through the pager if it needs more lines than the terminal has;
    whether it did."""
    command = _pager(args)
    if command is None or text.count("\n") + 1 < shutil.get_terminal_size().lines:
        return False
    env = {**os.environ, "LESS": os.environ.get("LESS", PAGER_LESS)}
    try:
        # A shell, as git runs it: $PAGER is a command line by convention ("less -S").
        pager = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env)
    except OSError:
        return False  # no such pager: print as if there were none
    assert pager.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # the reader quit before the end
        pager.stdin.write(f"{text}\n".encode())
        pager.stdin.close()
    pager.wait()
    return True


def warn(text: str) -> None:
    """A warning on stderr, so that stdout stays the answer."""
    print(f"flowforge: warning: {text}", file=sys.stderr)


def error(title: str, detail: str) -> None:
    """A refusal or failure as one line on stderr."""
    message = f"error: {title}: {detail}" if detail else f"error: {title}"
    print(printable(message), file=sys.stderr)
