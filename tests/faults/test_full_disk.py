"""Issue 39 item 6: a full disk's 503 says what happened.

The executions table is moved to a tablespace on a tmpfs of its own, which is then filled
up: PostgreSQL answers the intake's INSERT with `could not extend file … No space left on
device` (SQLSTATE 53100). The webhook must be refused with a 503 that says the database is
full — not "the database cannot be reached", which sends an operator to the network —
and nothing is stored; once there is room, the same webhook is accepted.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.faults.helpers import scalar, workflow
from tests.support.api import Api

SIZE = "2m"


@pytest.fixture
def full_tablespace(db: psycopg.Connection) -> Iterator[Path]:
    """The executions table on a tmpfs of SIZE; yields the tmpfs' directory (outside
    pytest's private tmp_path, which the server's user cannot enter)."""
    mount = Path(tempfile.mkdtemp(prefix="flowforge-small-disk-"))
    mount.chmod(0o755)
    options = f"size={SIZE},mode=0755"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], check=True)
    name = f"ff_full_{uuid.uuid4().hex[:8]}"
    try:
        location = mount / "pg"
        location.mkdir()
        owner = Path(db.execute("SHOW data_directory").fetchone()[0]).stat()
        os.chown(location, owner.st_uid, owner.st_gid)
        db.execute(f"CREATE TABLESPACE {name} LOCATION '{location}'")
        try:
            db.execute(f"ALTER TABLE executions SET TABLESPACE {name}")
            yield mount
        finally:
            db.execute("ALTER TABLE executions SET TABLESPACE pg_default")
            db.execute(f"DROP TABLESPACE {name}")
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        mount.rmdir()


def _fill(mount: Path) -> Path:
    """Write a file until the tmpfs has no room left."""
    filler = mount / "filler"
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:
            pass
    return filler


def test_a_full_disk_answers_503_saying_so_and_accepts_again_when_there_is_room(
    client: Api, db: psycopg.Connection, full_tablespace: Path
) -> None:
    client.publish("orders", workflow({"id": "t", "type": "transform", "output": {}}))
    filler = _fill(full_tablespace)
    refused = client.hook("orders", {"n": 1})
    assert refused.status_code == 503, refused.text
    detail = refused.json()["detail"]
    assert "full" in detail and "cannot be reached" not in detail, detail
    assert "Retry-After" in refused.headers
    assert scalar(db, "SELECT count(*) FROM executions") == 0

    filler.unlink()
    accepted = client.hook("orders", {"n": 1})
    assert accepted.status_code == 202, accepted.text
    assert scalar(db, "SELECT count(*) FROM executions") == 1
