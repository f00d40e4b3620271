"""The side a command talks to: the HTTP API (ApiClient, remote) or PostgreSQL
(Database, on the box). Both have the same methods with the same answers, so one handler
serves both; neither is imported here, so a remote command never loads the database
driver and `--help` loads neither."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TypeAlias, cast

from flowforge.cli.arguments import UsageError

if TYPE_CHECKING:
    from flowforge.cli.apiclient import ApiClient
    from flowforge.cli.direct import Database

Ops: TypeAlias = "ApiClient | Database"


def on_the_box(ops: Ops, args: argparse.Namespace) -> Database:
    """The database side, for a command that has no API endpoint; a usage error remotely."""
    if ops.remote:  # ApiClient
        raise UsageError(
            f"`flowforge {args.command}` has no API endpoint: it works on the database only; "
            "run it on the box with --db (and FLOWFORGE_DATABASE_URL)"
        )
    return cast("Database", ops)
