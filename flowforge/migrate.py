"""Apply pending sql/NNNN_name.sql files in order, the same files an operator can psql -f."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg

from flowforge.config import Settings
from flowforge.db import conninfo
from flowforge.errors import FlowForgeError

logger = logging.getLogger(__name__)

SQL_DIR = Path(os.environ.get("FLOWFORGE_SQL_DIR", Path(__file__).resolve().parent.parent / "sql"))
FILE_PATTERN = re.compile(r"^(\d{4}_[a-z0-9_]+)\.sql$")
# Any constant works; it only has to be the same for every migrating process.
ADVISORY_LOCK_KEY = 0x466C6F77  # "Flow"

APPLIED = "SELECT version, checksum FROM schema_migrations"
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
        match = FILE_PATTERN.match(path.name)
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


def main() -> int:
    """Entry point of bin/migrate."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = Settings.from_env()
    try:
        done = migrate(settings.database_url)
    except (MigrationError, psycopg.Error) as exc:
        print(f"migrate: {exc}", file=sys.stderr)
        return 1
    print(f"migrate: applied {len(done)} migration(s)" + (f": {', '.join(done)}" if done else ""))
    return 0
