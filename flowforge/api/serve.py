"""bin/api: gunicorn with FlowForge's defaults; any gunicorn option can follow."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence


def gunicorn_argv(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The gunicorn command line: sync workers, no --preload (the pool is per process)."""
    argv = ["gunicorn", "--worker-class", "sync", "--access-logfile", "-"]
    if "--bind" not in args and not any(a.startswith(("--bind=", "-b")) for a in args):
        argv += ["--bind", f"{env.get('HOST', '127.0.0.1')}:{env.get('PORT', '8000')}"]
    if "--workers" not in args and not any(a.startswith(("--workers=", "-w")) for a in args):
        argv += ["--workers", env.get("FLOWFORGE_API_WORKERS", str(2 * (os.cpu_count() or 1) + 1))]
    return [*argv, *args, "flowforge.api:create_app()"]


def main(args: Sequence[str], env: Mapping[str, str]) -> int:
    """Replace this process with gunicorn."""
    from gunicorn.app.wsgiapp import run

    sys.argv = gunicorn_argv(args, env)
    run()
    return 0
