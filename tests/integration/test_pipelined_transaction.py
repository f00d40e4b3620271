"""db.pipelined_transaction, the transaction of every unit of work and relay pass: two
round trips for reads then writes, and after any failure a rolled-back, idle connection.

Round trips are counted from libpq's own protocol trace: each run of messages the client
sends before the server's next answer is one wait for the server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flowforge.store.db import pipelined_transaction
from flowforge.store.outbox import TAKE_BATCH
from flowforge.store.runs import load_run, unit_of_work
from tests.support.definitions import transform, workflow

IDLE = psycopg.pq.TransactionStatus.IDLE


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE pt (id integer PRIMARY KEY)")
        yield conn


def round_trips(conn: psycopg.Connection, trace: Path, block: Callable[[], None]) -> int:
    """Run `block` with libpq tracing on; count the client's runs of messages."""
    with open(trace, "w") as out:
        conn.pgconn.trace(out.fileno())
        try:
            block()
        finally:
            conn.pgconn.untrace()
    directions = "".join(line.split("\t")[1] for line in trace.read_text().splitlines())
    return len(re.findall("F+", directions))


def rows(conn: psycopg.Connection) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM pt ORDER BY id")]


def test_a_unit_of_work_reads_then_writes_in_two_round_trips(
    conn: psycopg.Connection, tmp_path: Path
) -> None:
    def work() -> None:
        with unit_of_work(conn):
            first, second = conn.cursor(), conn.cursor()
            first.execute("SELECT count(*) FROM pt")
            second.execute("SELECT 2")
            assert first.fetchone() == (0,) and second.fetchone() == (2,)
            conn.execute("INSERT INTO pt VALUES (1)")
            conn.execute("INSERT INTO pt VALUES (2)")

    # psycopg's transaction() inside a pipeline took five: BEGIN, the reads, the block's
    # end, COMMIT, leaving the pipeline.
    assert round_trips(conn, tmp_path / "trace", work) == 2
    assert rows(conn) == [1, 2]
    assert conn.info.transaction_status == IDLE


def test_a_statement_that_fails_at_the_commit_rolls_back_the_whole_transaction(
    conn: psycopg.Connection,
) -> None:
    insert = "INSERT INTO pt VALUES (%s)"
    # Often enough that psycopg prepares the statement (prepare_threshold 5): after the
    # failure it must not believe in a statement the aborted pipeline never prepared.
    for n in range(1, 7):
        with pipelined_transaction(conn):
            conn.execute(insert, (n,))
    with pytest.raises(psycopg.errors.UniqueViolation), pipelined_transaction(conn):
        conn.execute(insert, (100,))
        conn.execute(insert, (1,))  # fails when the COMMIT's sync comes back
        conn.execute(insert, (101,))
    assert conn.info.transaction_status == IDLE
    assert rows(conn) == [1, 2, 3, 4, 5, 6]
    for n in (100, 101, 102, 103, 104, 105, 106):
        with pipelined_transaction(conn):
            conn.execute(insert, (n,))
    assert rows(conn)[-7:] == [100, 101, 102, 103, 104, 105, 106]


def test_an_error_in_the_block_rolls_back_what_it_wrote(conn: psycopg.Connection) -> None:
    with pytest.raises(RuntimeError), pipelined_transaction(conn):
        conn.execute("INSERT INTO pt VALUES (1)")
        assert conn.execute("SELECT count(*) FROM pt").fetchone() == (1,)
        raise RuntimeError("died before the commit")
    assert conn.info.transaction_status == IDLE
    assert rows(conn) == []


def test_a_failed_read_in_the_block_rolls_back_and_leaves_the_connection_usable(
    conn: psycopg.Connection,
) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero), pipelined_transaction(conn):
        conn.execute("INSERT INTO pt VALUES (1)")
        conn.execute("SELECT 1 / 0").fetchone()
    assert conn.info.transaction_status == IDLE
    assert rows(conn) == []
    with pipelined_transaction(conn):
        conn.execute("INSERT INTO pt VALUES (2)")
    assert rows(conn) == [2]


def test_it_is_not_opened_inside_another_transaction(conn: psycopg.Connection) -> None:
    with (
        conn.transaction(),
        pytest.raises(psycopg.ProgrammingError),
        pipelined_transaction(conn),
    ):
        pass


def test_the_relays_claim_never_scans_outbox_or_steps(db: psycopg.Connection) -> None:
    """Its plan must not depend on statistics: this database's tables were never analysed
    (as with autovacuum off), where `IN (...)` and a join planned two sequential scans."""
    plan = "\n".join(row[0] for row in db.execute("EXPLAIN " + TAKE_BATCH, {"limit": 500}))
    assert "Seq Scan" not in plan, plan
    assert "outbox_pkey" in plan and "steps_pkey" in plan, plan


def test_a_run_loaded_in_the_relays_transaction_commits_as_durably_as_configured(
    db: psycopg.Connection, app_client: Any, api_key: str
) -> None:
    """The relay's claim turns synchronous_commit off for its transaction; a pure step it
    runs there must not commit progress without the WAL flush: loading the run turns it
    back on."""
    document = workflow(transform("a", {"n": "{{ input.n }}"}), name="durable")
    headers = {"Authorization": f"Bearer {api_key}"}
    published = app_client.post(
        "/api/v1/workflows/durable/versions", json=document, headers=headers
    )
    assert published.status_code == 201, published.get_data(as_text=True)
    accepted = app_client.post("/hooks/durable", json={"n": 1})
    assert accepted.status_code == 202
    setting = "SELECT current_setting('synchronous_commit')"
    eid = accepted.get_json()["execution_id"]
    with pipelined_transaction(db):
        (claimed,) = db.execute(TAKE_BATCH, {"limit": 500}).fetchall()
        assert str(claimed[1]) == eid
        assert db.execute(setting).fetchone() == ("off",)
        assert load_run(db, eid) is not None
        assert db.execute(setting).fetchone() == ("on",)
    # What the role or database asks for is given back, not replaced by `on`...
    db.execute("SET synchronous_commit = 'remote_apply'")
    db.execute("INSERT INTO outbox (execution_id, step_id) VALUES (%s, 'a')", (eid,))
    with pipelined_transaction(db):
        assert len(db.execute(TAKE_BATCH, {"limit": 500}).fetchall()) == 1
        assert load_run(db, eid) is not None
        assert db.execute(setting).fetchone() == ("remote_apply",)
    # ... and a unit of work outside the relay keeps it.
    with pipelined_transaction(db):
        assert load_run(db, eid) is not None
        assert db.execute(setting).fetchone() == ("remote_apply",)
