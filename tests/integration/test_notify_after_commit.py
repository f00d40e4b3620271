"""The relay's NOTIFY travels after the commit that wrote wake-ups, not inside it
(issue 26): PostgreSQL serialises notifying commits on one database-wide lock held through
the WAL flush, which capped intake at one API process's worth."""

from __future__ import annotations

from typing import Any

import psycopg

from flowforge import flowcontrol, intake, runs
from flowforge.outbox import CHANNEL, LISTEN_OUTBOX


def test_the_hot_statements_send_no_notify_themselves() -> None:
    for statement in (intake.CREATE_EXECUTION, flowcontrol.GATED_INTAKE, runs.SAVE_RUN):
        assert "pg_notify" not in statement


def _notified(listener: psycopg.Connection) -> list[str]:
    return [n.channel for n in listener.notifies(timeout=2, stop_after=1)]


def test_an_accepted_webhook_still_wakes_the_relay(database_url: str, open_client: Any) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(LISTEN_OUTBOX)
        r = open_client.post("/hooks/open", json={"n": 1})
        assert r.status_code == 202, r.get_data(as_text=True)
        assert _notified(listener) == [CHANNEL]


def test_a_unit_of_work_notifies_after_its_commit_only_while_wake_ups_wait(
    db: psycopg.Connection, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(LISTEN_OUTBOX)
        with runs.unit_of_work(db):
            db.execute("SELECT 1")
        assert list(listener.notifies(timeout=0.5)) == []  # the outbox is empty
        with runs.unit_of_work(db):
            db.execute("INSERT INTO outbox (execution_id, step_id) VALUES (gen_random_uuid(), 'x')")
        assert _notified(listener) == [CHANNEL]
