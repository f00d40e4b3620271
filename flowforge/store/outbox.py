"""The transactional outbox: wake-ups written with the change that causes them.

Writers insert rows in their own transaction (runs.save_run, the intake, the timer
scanner, the reconciler; each builds its inserts and NOTIFY from the fragments here); the
relay deletes rows (FOR UPDATE SKIP LOCKED) in a transaction, publishes them, and
commits only after the broker's confirmation. A relay that dies mid-batch
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
# The relays' wake-up sent right after a pipelined transaction's COMMIT, in the same round
# trip (db.pipelined_transaction's `then`): a statement of its own, so its own transaction,
# skipped by the server when the COMMIT failed. Whether this transaction wrote a wake-up
# is not known when the COMMIT is sent; whether the outbox holds one afterwards is cheap to
# ask (the relays keep it near empty) and is what a relay needs to know.
NOTIFY_IF_PENDING = f"SELECT {NOTIFY} WHERE EXISTS (SELECT FROM outbox)"

# Wake-ups, for set-based statements (runs.SAVE_RUN, the intake, ...): followed by a
# SELECT of (execution_id, step_id), as in `wakeups AS ({INSERT_WAKEUPS} SELECT ... FROM woken)`.
INSERT_WAKEUPS = "INSERT INTO outbox (execution_id, step_id)"

# Oldest first; rows locked by another relay are skipped, not waited for. Claimed and
# deleted in one statement, in a transaction that commits only after the broker took the
# messages (or rolls back, and they stay): one statement and round trip less per batch.
# That commit need not wait for the disk (synchronous_commit off, for this transaction
# only, set by the statement itself to save another round trip): a delete lost in a crash
# only publishes its wake-ups again, and a duplicate changes nothing
# (docs/contract.md#lost-messages). Every other writer of the outbox commits synchronously. The
# configured value is kept in flowforge.synchronous_commit for the pure step the relay may run in
# the same transaction: runs.LOCK_EXECUTION puts it back.
# Each row comes with its step's type (NULL: no such step), so that the relay can run a
# lone pure step itself (relay.py) without a look at the execution first.
# Written so that its plan cannot depend on statistics (a table never analysed, as with
# autovacuum off, or a burst that outgrew them): `= ANY (ARRAY(...))` deletes through the
# primary key and the step's type is a primary-key lookup per row, where `IN (...)` and a
# join were planned as sequential scans of outbox and steps on fresh statistics.
TAKE_BATCH = """
WITH taken AS (
    DELETE FROM outbox
    WHERE id = ANY (ARRAY(SELECT id FROM outbox ORDER BY id LIMIT %(limit)s
                          FOR UPDATE SKIP LOCKED))
      AND (SELECT set_config('synchronous_commit',
                             CASE WHEN set_config('flowforge.synchronous_commit',
                                                  current_setting('synchronous_commit'), true)
                                       IS NOT NULL THEN 'off' END,
                             true)) IS NOT NULL
    RETURNING id, execution_id, step_id, created_at
)
SELECT t.id, t.execution_id, t.step_id, t.created_at,
       (SELECT s.type FROM steps s
        WHERE s.execution_id = t.execution_id AND s.step_id = t.step_id)
FROM taken t
"""
# What the broker returned as unroutable goes back, unchanged, for a later batch.
PUT_BACK = """
INSERT INTO outbox (id, execution_id, step_id, created_at)
SELECT * FROM unnest(%(id)s::bigint[], %(execution_id)s::uuid[], %(step_id)s::text[],
                     %(created_at)s::timestamptz[])
"""
BACKLOG = "SELECT count(*) FROM outbox"
