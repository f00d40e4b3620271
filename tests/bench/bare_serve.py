"""Serve the bare-Flask limit under exactly the gunicorn command line bin/api builds.

The argv comes from flowforge.api.serve.gunicorn_argv itself, with only the WSGI
factory swapped, so a change to bin/api's defaults changes the limit with it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from flowforge.api.serve import gunicorn_argv

FLOWFORGE_APP = "flowforge.api:create_app()"
BARE_APP = "tests.bench.bare_app:create_app()"


def argv(args: list[str], env: Mapping[str, str]) -> list[str]:
    """bin/api's gunicorn argv for these arguments, serving the bare app instead."""
    built = gunicorn_argv(args, env)
    if built[-1] != FLOWFORGE_APP:
        raise SystemExit(f"bare_serve: bin/api no longer ends with {FLOWFORGE_APP}: {built}")
    return [*built[:-1], BARE_APP]


def main() -> None:
    from gunicorn.app.wsgiapp import run

    sys.argv = argv(sys.argv[1:], os.environ)
    run()


if __name__ == "__main__":
    main()
