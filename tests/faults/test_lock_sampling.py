"""The lock sample of the freeze tests (tests/support/locks.py) reports only sessions a
client really left holding locks where no server timeout reaches.

A session no one freezes takes a lock and commits, in one round trip, over and over: it
is never waiting for its client while it holds a lock. One query of pg_stat_activity and
pg_locks still catches it, now and then, `idle` or `active`/ClientRead beside the locks
of the transaction it is passing through (the state snapshot and the lock table are read
at different instants) — one sample in 130 on a loaded two-core machine; 400 freezes of
tests/faults/test_random_freezes.py's busy worker hit it once. A confirmed sample reports
nothing.
"""

from __future__ import annotations

import threading

import psycopg

from tests.support.locks import confirmed

APP = "lock-sampling-churn"
# test_random_freezes' query, for this application name.
UNCOVERED = """
SELECT a.pid, a.state, a.state_change, a.wait_event, left(a.query, 60) AS query,
       array_agg(DISTINCT l.locktype) AS locks
FROM pg_stat_activity a
JOIN pg_locks l ON l.pid = a.pid AND l.granted AND l.locktype <> 'virtualxid'
WHERE a.application_name = %(app)s
  AND ((a.state = 'active' AND a.wait_event = 'ClientRead') OR a.state = 'idle')
GROUP BY a.pid, a.state, a.state_change, a.wait_event, a.query
"""
# A lock held for a moment, then committed, in one round trip (a Sync at its end).
ROUND_TRIP = "BEGIN; SELECT pg_advisory_xact_lock(4242); SELECT pg_sleep(0.002); COMMIT"
SAMPLES = 1000


def test_a_session_passing_between_states_is_not_reported(
    database_url: str, db: psycopg.Connection
) -> None:
    stop = threading.Event()

    def churn() -> None:
        with psycopg.connect(database_url, autocommit=True, application_name=APP) as conn:
            while not stop.is_set():
                conn.execute(ROUND_TRIP)

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    found = []
    try:
        for _ in range(SAMPLES):
            found += confirmed(lambda: db.execute(UNCOVERED, {"app": APP}).fetchall(), 0.01)
    finally:
        stop.set()
        thread.join(10)
    assert not found, f"{len(found)} of {SAMPLES} samples reported the churning one: {found[:3]}"
