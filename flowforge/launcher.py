"""How bin/api, bin/worker and bin/migrate find the interpreter that has FlowForge's
dependencies, so `bin/migrate` works from a fresh shell without activating anything.

Standard library only: this runs before we know whether the dependencies are importable.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The import names of setup.cfg's install_requires.
REQUIRED = ("flask", "gunicorn", "psycopg", "pika", "requests", "prometheus_client")


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


# prometheus_client's multiprocess mode: where each gunicorn worker keeps its counters.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
METRICS_DIR_PREFIX = "flowforge-api-metrics-"


def private_metrics_dir(env: MutableMapping[str, str]) -> str:
    """Make a fresh, empty directory for this API server's metric files and name it in
    PROMETHEUS_MULTIPROC_DIR, replacing any inherited value.

    bin/api calls this before anything imports prometheus_client, which chooses its
    multiprocess mode once, at import, in the gunicorn master its workers fork from. A
    directory of its own per start means no counts of an earlier server (or of another
    one on the host) are ever summed in; flowforge/api/serve.py removes it when gunicorn
    exits and marks each dead worker in it."""
    _remove_orphaned_metrics_dirs()
    path = tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-")
    env[METRICS_DIR_ENV] = path
    return path


def _remove_orphaned_metrics_dirs() -> None:
    """Directories of API servers that died without gunicorn's on_exit (SIGKILL, a
    crash): their master's pid, in the name, is gone."""
    for path in Path(tempfile.gettempdir()).glob(f"{METRICS_DIR_PREFIX}*-*"):
        pid = path.name.removeprefix(METRICS_DIR_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def no_metrics_dir(env: MutableMapping[str, str]) -> None:
    """bin/worker is one process: its counters live in memory, never in an API's files."""
    env.pop(METRICS_DIR_ENV, None)
