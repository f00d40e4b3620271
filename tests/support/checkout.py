"""A copy of the checkout as a fresh clone holds it, for the tests that install or run
FlowForge the way a newcomer does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.processes import ROOT


def fresh_copy(destination: Path, without: tuple[str, ...] = ()) -> None:
    """What a clone holds: tracked and new files, nothing ignored (no .venv, no logs), and
    nothing under the folders `without` names ("tests/")."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, map(os.fsdecode, files)):
        source = ROOT / name
        if source.is_file() and not name.startswith(without):
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode)
