"""How bin/api, bin/worker and bin/migrate find the interpreter that has FlowForge's
dependencies, so `bin/migrate` works from a fresh shell without activating anything.

Standard library only: this runs before we know whether the dependencies are importable.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The import names of setup.cfg's install_requires.
REQUIRED = ("flask", "gunicorn", "psycopg", "pika", "requests")


def missing_modules() -> list[str]:
    """Dependencies this interpreter cannot import."""
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def ensure_dependencies(script: str) -> None:
    """Return if this interpreter has the dependencies; otherwise re-execute the script with
    the project's .venv, or say exactly what to run and exit 1.

    An interpreter that already has them (an activated venv, a container image with the
    package installed) is used as it is.
    """
    missing = missing_modules()
    if not missing:
        return
    venv_python = ROOT / ".venv" / "bin" / "python"
    if venv_python.exists() and Path(sys.prefix).resolve() != venv_python.parent.parent.resolve():
        os.execv(venv_python, [str(venv_python), script, *sys.argv[1:]])
    name = Path(script).name
    print(
        f"{name}: {sys.executable} cannot import {', '.join(missing)}.\n"
        f"Create the project's virtualenv once, then run bin/{name} again:\n"
        f"  cd {ROOT} && python3 -m venv .venv && .venv/bin/pip install -e .",
        file=sys.stderr,
    )
    sys.exit(1)
