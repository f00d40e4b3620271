"""A first install prints nothing alarming: setuptools finds every package, the
console's static/ and templates/ data directories included, and warns about none, not
even its "Editable installation" notice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.checkout import fresh_copy


def test_an_editable_install_of_a_fresh_copy_prints_no_warning(tmp_path: Path) -> None:
    clone = tmp_path / "flowforge"
    fresh_copy(clone, without=("tests/",))
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    pip = str(tmp_path / "venv/bin/pip")
    # As bin/local-env does: a current pip shows what the build backend warns about.
    subprocess.run([pip, "install", "-q", "--upgrade", "pip"], check=True, timeout=300)
    done = subprocess.run(
        [pip, "install", "-q", "--no-deps", "-e", str(clone)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    # What every install printed ~90 lines of: a data directory setuptools did not list.
    assert "is absent from the `packages` configuration" not in said, said
    assert "Package would be ignored" not in said, said
    # The ten lines of setuptools' "Editable installation" notice (its import hook).
    assert "Warning" not in said and "Editable installation" not in said, said
