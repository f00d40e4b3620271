"""The transactional outbox: wake-ups written with the change that causes them.

Writers insert rows in their own transaction (see runs.save_run and intake); the
relay claims rows with FOR UPDATE SKIP LOCKED, publishes them, waits for the broker's
confirmation and deletes them in that same transaction. A relay that dies mid-batch
rolls back and releases its rows, so another relay publishes them again: a benign
duplicate, never a loss, and an old claimant can never mark rows it no longer holds.
"""

from __future__ import annotations

CHANNEL = "flowforge_outbox"
# Delivered at commit; collapsed by PostgreSQL when one transaction sends it twice.
NOTIFY_OUTBOX = f"SELECT pg_notify('{CHANNEL}', '')"
LISTEN_OUTBOX = f"LISTEN {CHANNEL}"

# Oldest first; rows locked by another relay are skipped, not waited for.
CLAIM_BATCH = """
SELECT id, execution_id, step_id FROM outbox
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""
DELETE_PUBLISHED = "DELETE FROM outbox WHERE id = ANY(%(ids)s)"
BACKLOG = "SELECT count(*) FROM outbox"
