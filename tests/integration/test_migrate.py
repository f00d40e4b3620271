"""Migrations apply by hand with psql -f and by bin/migrate, to the same schema."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from flowforge.store.migrate import MigrationError, discover, migrate


@pytest.fixture
def empty_db(pg_admin_url: str) -> Iterator[Callable[[], str]]:
    """Empty databases, created and dropped by the test."""
    made: list[str] = []

    def make() -> str:
        name = f"ff_m_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)

    yield make
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for name in made:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def schema(url: str) -> str:
    dump = subprocess.run(
        ["pg_dump", "--schema-only", "--no-owner", "-d", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return "\n".join(
        line
        for line in dump.splitlines()
        if not line.startswith(("--", "\\restrict", "\\unrestrict"))
    )


def test_psql_by_hand_and_bin_migrate_build_the_same_schema(empty_db: Callable[[], str]) -> None:
    by_hand, by_tool = empty_db(), empty_db()
    for migration in discover():
        subprocess.run(
            ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-d", by_hand, "-f", str(migration.path)],
            check=True,
            capture_output=True,
        )
    assert migrate(by_tool) == [m.version for m in discover()]
    assert schema(by_hand) == schema(by_tool)
    # bin/migrate adopts files applied by hand (records their checksum) and applies nothing
    assert migrate(by_hand) == []
    with psycopg.connect(by_hand) as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM schema_migrations WHERE checksum IS NULL"
            ).fetchone()[0]
            == 0
        )
    # applying a file twice by hand fails cleanly and changes nothing
    again = subprocess.run(
        ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-d", by_hand, "-f", str(discover()[0].path)],
        capture_output=True,
        text=True,
    )
    assert again.returncode != 0


def test_concurrent_migrations_apply_each_file_once(empty_db: Callable[[], str]) -> None:
    url = empty_db()
    with ThreadPoolExecutor(4) as pool:
        applied = list(pool.map(lambda _: migrate(url), range(4)))
    assert sorted(map(len, applied)) == [0, 0, 0, len(discover())]


def test_a_changed_file_is_refused(empty_db: Callable[[], str], tmp_path: Path) -> None:
    url = empty_db()
    for migration in discover():
        shutil.copy(migration.path, tmp_path / migration.path.name)
    migrate(url, tmp_path)
    first = sorted(tmp_path.iterdir())[0]
    first.write_text(first.read_text() + "\n-- edited after landing\n")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(url, tmp_path)
