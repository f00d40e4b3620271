"""Run one `flowforge` command: parse it, import its handler, and give the handler the
side it talks to (the HTTP API, or PostgreSQL on the box); errors become one line on
stderr and an exit status.

Each side is imported only when the command uses it: remote commands never load psycopg
or the persistence modules, and commands that need neither (completion) load nothing."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence

from flowforge.cli.arguments import USAGE, UsageError, api_url
from flowforge.cli.output import error, printable
from flowforge.cli.parser import build_parser
from flowforge.errors import ClientError, DatabaseUnavailable, FlowForgeError, SchemaMissing

REFUSED = 1
# API answers that mean the command was wrong as typed, not refused.
USAGE_STATUSES = frozenset({400, 413, 415, 422})


def handler(name: str) -> Callable[..., int | None]:
    """The function a command names in the parser ("executions.list_executions"), which
    takes the side it talks to (Ops; None for an offline command) and the arguments."""
    module, function = name.rsplit(".", 1)
    found: Callable[..., int | None] = getattr(
        importlib.import_module(f"flowforge.cli.{module}"), function
    )
    return found


def _remote(args: argparse.Namespace) -> str | None:
    """The API URL to use, or None for the database."""
    explicit = getattr(args, "api", None)
    if getattr(args, "db", False):
        if explicit:
            raise UsageError("--api and --db exclude each other")
        return None
    if explicit:
        return str(explicit)
    from_env = os.environ.get("FLOWFORGE_API_URL", "").strip()
    if from_env:
        try:
            return api_url(from_env)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"FLOWFORGE_API_URL: {exc}") from None
    return None


def console() -> int:
    """The `flowforge` console script: `main` in a process of its own."""
    # Like every Unix tool: `flowforge ... | head -n1` ends quietly when head has read
    # enough, instead of a BrokenPipeError traceback. Only here, never in main(): a
    # process that calls main() in-process (the tests) must not die of a closed pipe.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return main()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `flowforge` command; its exit status."""
    args = build_parser().parse_args(argv)
    args.format = getattr(args, "format", "table")
    if getattr(args, "offline", False):
        # Needs neither the API nor the database (shell completion, `flowforge test`).
        return handler(args.handler)(None, args) or 0
    try:
        url = _remote(args)
        if url is not None:
            return _run_remote(url, args)
    except UsageError as exc:
        error("usage", str(exc))
        return USAGE
    return _run_local(args)


def _run_remote(url: str, args: argparse.Namespace) -> int:
    key = os.environ.get("FLOWFORGE_API_KEY", "").strip()
    if not key:
        raise UsageError(
            f"FLOWFORGE_API_KEY is not set: --api {url} needs an API key "
            "(`flowforge apikey create` on the box makes one)"
        )
    from flowforge.cli.apiclient import ApiClient, ApiError, ApiUnreachable

    try:
        status = handler(args.handler)(ApiClient(url, key), args)
    except ClientError as exc:  # checked here before any call (apply's DefinitionInvalid)
        return _invalid(exc)
    except ApiError as exc:
        error(exc.title, exc.detail)
        for problem in exc.errors:
            print(printable(f"  {problem.get('path')}: {problem.get('message')}"), file=sys.stderr)
        return USAGE if exc.status in USAGE_STATUSES else REFUSED
    except ApiUnreachable as exc:
        error("unreachable", str(exc))
        return REFUSED
    except (KeyError, TypeError, AttributeError) as exc:
        # A 2xx JSON object without what a FlowForge API answers: not our API (a stub, a
        # portal, another version behind the URL), said in one line, not a traceback.
        error("unexpected answer", f"{url} answered without {exc}: is this a FlowForge API?")
        return REFUSED
    return status or 0


def _invalid(exc: ClientError) -> int:
    """A refusal of this side's own checks (an invalid definition: every problem, one a
    line with its path)."""
    error(exc.title, exc.detail)
    if not exc.errors:
        return USAGE if exc.status in USAGE_STATUSES else REFUSED
    for problem in exc.errors:
        print(f"  {problem['path']}: {problem['message']}", file=sys.stderr)
    return USAGE


def _run_local(args: argparse.Namespace) -> int:
    # Only here: remote commands never load the database driver (flowforge/cli/ops.py).
    import psycopg

    from flowforge.cli.direct import Database
    from flowforge.store.config import Settings
    from flowforge.store.db import conninfo, wrap_exceptions
    from flowforge.store.hints import database_hint

    try:
        settings = Settings.from_env()
    except FlowForgeError as exc:
        error("configuration", str(exc))
        return USAGE
    try:
        # A session of its own (prepared statements, transactions): never through a pooler.
        # psycopg's errors leave as FlowForge's (the one translation, store/db.py).
        with (
            wrap_exceptions(every_error=True),
            psycopg.connect(conninfo(settings.direct_url), autocommit=True) as conn,
        ):
            status = handler(args.handler)(Database(conn), args)
    except UsageError as exc:
        error("usage", str(exc))
        return USAGE
    except ClientError as exc:
        return _invalid(exc)
    except DatabaseUnavailable as exc:
        print(f"flowforge: {str(exc).strip()}", file=sys.stderr)
        print(f"flowforge: {database_hint(settings.direct_url)}", file=sys.stderr)
        return REFUSED
    except SchemaMissing as exc:
        print(f"flowforge: {str(exc).splitlines()[0]}", file=sys.stderr)
        print(
            "flowforge: this database has no FlowForge schema yet: run bin/migrate", file=sys.stderr
        )
        print(f"flowforge: {database_hint(settings.direct_url)}", file=sys.stderr)
        return REFUSED
    except (FlowForgeError, OSError, ValueError) as exc:
        error("failed", str(exc))
        return REFUSED
    return status or 0
