"""An outbound concurrency is exact under a race for the key's row lock
(docs/contract.md#outbound-limits).

Soak seeds 11 and 2311 saw three requests of a limit of concurrency 2 in flight at the
target: a claim that waited for the key's row lock counted the key's slots with the
snapshot its statement began with, from before the holder committed its slot, and so
admitted one more. Here the race is forced: claim A admits (and holds the row lock);
claim B's admit waits for it; A commits; B must then see A's slot and wait.
"""

from __future__ import annotations

import threading
import uuid

import psycopg

from flowforge.domain.definitions import LimitSpec
from flowforge.domain.model import LimitReason
from flowforge.store import outbound
from tests.support.processes import wait_for

LIMITS = [(outbound.LimitKey("1", "race"), LimitSpec(concurrency=1))]
BLOCKED = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'
"""


def test_a_claim_that_waited_for_the_key_lock_counts_the_slot_taken_meanwhile(
    database_url: str, db: psycopg.Connection
) -> None:
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    waits: list[outbound.Wait | None] = []
    with psycopg.connect(database_url) as a, psycopg.connect(database_url) as b:
        assert outbound.admit(a, first, "call", LIMITS, 5.0) is None  # holds the row lock

        def claim_b() -> None:
            waits.append(outbound.admit(b, second, "call", LIMITS, 5.0))
            b.commit()

        racer = threading.Thread(target=claim_b)
        racer.start()
        wait_for(lambda: db.execute(BLOCKED).fetchone()[0] == 1, timeout=10, message="B waits")
        a.commit()
        racer.join(10)
    assert len(waits) == 1
    wait = waits[0]
    assert wait is not None, "admitted a second request into a concurrency of 1"
    assert wait.reason == LimitReason.CONCURRENCY
    assert db.execute("SELECT count(*) FROM outbound_slots").fetchone()[0] == 1
