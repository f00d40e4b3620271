"""Apply pending sql/NNNN_name.sql files in order, the same files an operator can psql -f."""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from flowforge.errors import DatabaseError, DatabaseExists, DatabaseUnavailable, FlowForgeError
from flowforge.store import notifications
from flowforge.store.config import Settings
from flowforge.store.db import conninfo, wrap_exceptions
from flowforge.store.hints import database_hint
from flowforge.trust import sealing

logger = logging.getLogger(__name__)

SQL_DIR = Path(os.environ.get("FLOWFORGE_SQL_DIR", Path(__file__).resolve().parents[2] / "sql"))
FILE_PATTERN = re.compile(r"(\d{4}_[a-z0-9_]+)\.sql")
# Any constant works; it only has to be the same for every migrating process.
ADVISORY_LOCK_KEY = 0x466C6F77  # "Flow"

APPLIED = "SELECT version, checksum FROM schema_migrations"
DATABASE_EXISTS = "SELECT 1 FROM pg_database WHERE datname = %(name)s"
CREATE_DATABASE = sql.SQL("CREATE DATABASE {}")
RECORD_CHECKSUM = """
UPDATE schema_migrations SET checksum = %(checksum)s
WHERE version = %(version)s AND checksum IS NULL
"""


class MigrationError(FlowForgeError):
    """A migration file changed after it was applied, or failed to apply."""


@dataclass(frozen=True)
class Migration:
    """One forward-only SQL file."""

    version: str
    path: Path

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def discover(sql_dir: Path = SQL_DIR) -> list[Migration]:
    """The migration files, ordered by their number."""
    found = []
    for path in sorted(sql_dir.iterdir()):
        match = FILE_PATTERN.fullmatch(path.name)
        if match:
            found.append(Migration(match.group(1), path))
    return found


def migrate(database_url: str, sql_dir: Path = SQL_DIR) -> list[str]:
    """Apply what is pending under an advisory lock; return the versions applied."""
    applied_now = []
    with psycopg.connect(conninfo(database_url), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_LOCK_KEY,))
        try:
            applied = _applied(conn)
            for migration in discover(sql_dir):
                recorded = applied.get(migration.version, "missing")
                if recorded == "missing":
                    logger.info("applying %s", migration.path.name)
                    # Each file carries its own BEGIN/COMMIT, exactly as psql -f runs it.
                    conn.execute(migration.text)
                    applied_now.append(migration.version)
                elif recorded is not None and recorded != migration.checksum:
                    raise MigrationError(
                        f"{migration.path.name} changed after it was applied "
                        f"(recorded sha256 {recorded[:12]}…, file {migration.checksum[:12]}…)"
                    )
                conn.execute(
                    RECORD_CHECKSUM,
                    {"version": migration.version, "checksum": migration.checksum},
                )
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK_KEY,))
    return applied_now


def _applied(conn: psycopg.Connection) -> dict[str, str | None]:
    exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    return {version: checksum for version, checksum in conn.execute(APPLIED)}


def create_database(database_url: str) -> str | None:
    """Create the database the URL names unless it exists (through the `postgres` database,
    as createdb does); its name if it was created."""
    name = psycopg.conninfo.conninfo_to_dict(database_url).get("dbname")
    if not name:
        raise MigrationError("the database URL names no database")
    maintenance = psycopg.conninfo.make_conninfo(database_url, dbname="postgres")
    with psycopg.connect(maintenance, autocommit=True) as conn:
        if conn.execute(DATABASE_EXISTS, {"name": name}).fetchone():
            return None
        try:
            with wrap_exceptions(every_error=True):
                conn.execute(CREATE_DATABASE.format(sql.Identifier(str(name))))
        except DatabaseExists:
            return None  # another bin/migrate --create got there first
    return str(name)


def build_parser() -> argparse.ArgumentParser:
    """bin/migrate's options."""
    parser = argparse.ArgumentParser(
        prog="bin/migrate",
        description="Apply pending sql/NNNN_*.sql migrations, in order, to the database "
        "FLOWFORGE_DATABASE_URL names (default postgresql://localhost/flowforge). "
        "Safe to run again and from several hosts at once (advisory lock).",
    )
    parser.add_argument(
        "--create",
        action="store_true",
        help="create the database first if it does not exist (needs CREATEDB)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of bin/migrate."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        settings = Settings.from_env()
        with wrap_exceptions(every_error=True):
            if args.create and (created := create_database(settings.direct_url)):
                print(f"migrate: created database {created}")
            # The advisory lock is a session's: PostgreSQL itself, never a transaction pooler.
            done = migrate(settings.direct_url)
    except (DatabaseUnavailable, DatabaseError) as exc:
        print(f"migrate: {str(exc).strip()}", file=sys.stderr)
        print(f"migrate: {database_hint(settings.direct_url)}", file=sys.stderr)
        return 1
    except FlowForgeError as exc:
        print(f"migrate: {exc}", file=sys.stderr)
        return 1
    print(f"migrate: applied {len(done)} migration(s)" + (f": {', '.join(done)}" if done else ""))
    # SQL cannot seal what 0004 left in clear (it has no key); this step can, on every run.
    if _seal_clear_values(
        settings,
        lambda conn: sealing.seal_clear_secrets(conn, settings.encryption_key),
        sealing.EncryptionKeyMissing,
        "webhook signing secrets are still stored in clear and do not verify; "
        "set FLOWFORGE_ENCRYPTION_KEY (python -m flowforge.trust.sealing makes one) and run "
        "bin/migrate again",
        "webhook signing secret(s) that were stored in clear",
    ):
        return 1
    # Likewise what sql/0067 left in clear: notification endpoints' secrets and Slack URLs,
    # under FLOWFORGE_NOTIFY_KEY (the worker sends from the clear values until then).
    return _seal_clear_values(
        settings,
        lambda conn: notifications.seal_clear(conn, settings.notify_key),
        notifications.NotifyKeyMissing,
        "notification endpoints' secrets are still stored in clear; set "
        "FLOWFORGE_NOTIFY_KEY (python -m flowforge.trust.sealing makes one) for bin/migrate, "
        "bin/api and bin/worker and run bin/migrate again",
        "notification endpoint secret(s) stored in clear",
    )


def _seal_clear_values(
    settings: Settings,
    seal: Callable[[psycopg.Connection], int],
    key_missing: type[Exception],
    key_advice: str,
    sealed_what: str,
) -> int:
    """Run one sealing step after the migrations and print its outcome; the exit status.

    Each secret kind is sealed under its own key by its own module, but what bin/migrate
    tells the operator (the key to set, how many it sealed, a database failure) is the same.
    """
    try:
        with (
            wrap_exceptions(every_error=True),
            psycopg.connect(conninfo(settings.direct_url), autocommit=True) as conn,
        ):
            sealed = seal(conn)
    except key_missing:
        print(f"migrate: {key_advice}", file=sys.stderr)
        return 1
    except (DatabaseUnavailable, DatabaseError) as exc:
        print(f"migrate: {exc}", file=sys.stderr)
        return 1
    if sealed:
        print(f"migrate: sealed {sealed} {sealed_what}")
    return 0
