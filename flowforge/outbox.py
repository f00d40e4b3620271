"""The transactional outbox: wake-ups written with the change that causes them.

Writers insert rows in their own transaction (runs.save_run, the intake, the timer
scanner, the reconciler; each builds its inserts and NOTIFY from the fragments here); the
relay claims rows with FOR UPDATE SKIP LOCKED, publishes them, waits for the broker's
confirmation and deletes them in that same transaction. A relay that dies mid-batch
rolls back and releases its rows, so another relay publishes them again: a benign
duplicate, never a loss, and an old claimant can never mark rows it no longer holds.
"""

from __future__ import annotations

CHANNEL = "flowforge_outbox"
# The wake-up of the relay, as an SQL expression for statements that send it themselves.
# Delivered at commit; collapsed by PostgreSQL when one transaction sends it twice.
NOTIFY = f"pg_notify('{CHANNEL}', '')"
NOTIFY_OUTBOX = f"SELECT {NOTIFY}"
LISTEN_OUTBOX = f"LISTEN {CHANNEL}"

# One wake-up (runs.save_run) ...
INSERT_WAKEUP = "INSERT INTO outbox (execution_id, step_id) VALUES (%(execution_id)s, %(step_id)s)"
# ... or a set of them, for set-based statements: followed by a SELECT of
# (execution_id, step_id), as in `wakeups AS ({INSERT_WAKEUPS} SELECT ... FROM woken)`.
INSERT_WAKEUPS = "INSERT INTO outbox (execution_id, step_id)"

# Oldest first; rows locked by another relay are skipped, not waited for.
CLAIM_BATCH = """
SELECT id, execution_id, step_id FROM outbox
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""
DELETE_PUBLISHED = "DELETE FROM outbox WHERE id = ANY(%(ids)s)"
BACKLOG = "SELECT count(*) FROM outbox"
