"""What to tell a person whose command could not reach PostgreSQL: which setting to change.

A bare `database "flowforge" does not exist` sends a newcomer looking for a file to edit;
the answer is always the same environment variable, so every command line tool says so.
"""

from __future__ import annotations

import logging
import re

import psycopg

from flowforge.errors import DatabaseError, DatabaseUnavailable
from flowforge.store.db import wrap_exceptions

_URL_PASSWORD = re.compile(r"^(postgres(?:ql)?://[^:/@]*):[^@]*@")


def shown_url(url: str) -> str:
    """The value as it may be printed: as given, but never with its password."""
    try:
        with wrap_exceptions(every_error=True):
            params = psycopg.conninfo.conninfo_to_dict(url)
    except DatabaseError:
        return "(not a valid connection string)"
    if "password" not in params:
        return url
    if _URL_PASSWORD.match(url):
        return _URL_PASSWORD.sub(r"\1:...@", url)
    params["password"] = "..."
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def database_hint(url: str) -> str:
    """One line naming FLOWFORGE_DATABASE_URL and the value in use."""
    return (
        f"FLOWFORGE_DATABASE_URL is {shown_url(url)}: set it to the database to use "
        "(bin/migrate --create makes a missing one)"
    )


def check_database_at_start(url: str, program: str) -> None:
    """Say once, at start-up, which variable to change when the database cannot be reached.
    The program starts anyway and keeps retrying: an outage is not a configuration error."""
    try:
        with wrap_exceptions(every_error=True):
            psycopg.connect(url, connect_timeout=3).close()
    except (DatabaseUnavailable, DatabaseError) as exc:
        logging.getLogger(program).warning(
            "cannot reach the database at start-up; retrying",
            extra={"error": str(exc).strip(), "hint": database_hint(url)},
        )
