"""The reconciler: ready work whose wake-up message went missing is dispatched again.

PostgreSQL is the truth and RabbitMQ only carries wake-ups, so a purged queue or a reset
broker loses no work: a ready step with no outbox row that nobody took up for a while
gets a new wake-up, and so does a workflow step whose child ended
(docs/contract.md#child-workflows). Likewise a free concurrency slot with a queue behind it is
handed on.
"""

from __future__ import annotations

import logging

import psycopg_pool

from flowforge.domain.model import FLOW_CONTROL_ACTOR
from flowforge.store import children, flowcontrol
from flowforge.store.db import notify_relay, one, wrap_exceptions
from flowforge.store.outbox import INSERT_WAKEUPS
from flowforge.usecases import actions
from flowforge.worker.broker import QueueHead

logger = logging.getLogger(__name__)

# Ready steps whose wake-up is neither in the outbox nor was dispatched recently: the
# message was lost (queue purged, broker reset, link blackholed). Dispatch them again after
# one interval, however often that happened: a lost wake-up was never handled. The interval
# is counted back from the head of the queue when the consumer knows it (`reached`,
# broker.QueueHead), else from now(): under a backlog a wake-up queued after the head is
# still waiting its turn, not lost, and another copy of it would only cost the consumer a
# claim (issue 39: 3 messages per queued execution at 10x the drain rate). Only a
# step whose wake-ups failed and were dead-lettered (failed_wakeups, counted by the
# consumer) waits twice as long per failure, up to 2**MAX_DOUBLINGS intervals, so the
# dead-letter queue gets it rarely, not every interval forever. Returns how many of the
# re-dispatched steps had failed before. A step that waits for an outbound limit is
# not stale until its wake time passed.
REDISPATCH = f"""
WITH stale AS (
    SELECT s.execution_id, s.step_id, s.failed_wakeups FROM steps s
    WHERE s.status = 'ready'
      AND s.ready_at < coalesce(%(reached)s::timestamptz, now()) - make_interval(
              secs => %(after_s)s * 2 ^ least(s.failed_wakeups, %(max_doublings)s))
      AND NOT EXISTS (SELECT 1 FROM outbox o
                      WHERE o.execution_id = s.execution_id AND o.step_id = s.step_id)
      AND NOT EXISTS (SELECT 1 FROM executions e
                      WHERE e.id = s.execution_id AND e.status = 'paused')
      -- A step that waits for an outbound limit has its wake-up to come.
      AND NOT EXISTS (SELECT 1 FROM limit_waits w
                      WHERE w.execution_id = s.execution_id AND w.step_id = s.step_id
                        AND NOT w.woken)
    ORDER BY s.ready_at LIMIT 1000
    FOR UPDATE OF s SKIP LOCKED
), touched AS (
    UPDATE steps s SET ready_at = now() FROM stale
    WHERE s.execution_id = stale.execution_id AND s.step_id = stale.step_id
), sent AS (
    {INSERT_WAKEUPS} SELECT execution_id, step_id FROM stale
)
SELECT count(*), count(*) FILTER (WHERE failed_wakeups > 0) FROM stale
"""
MAX_DOUBLINGS = 7
# Under on_full cancel_oldest (or a schedule's overlap cancel_other) what will run — the
# holders nobody asked to stop and the queue — beyond their key's limit, oldest first: the
# intake queues the new execution first and stops the oldest after its commit; when that
# stop could not run (the holder was locked, the database went away) they are stopped here.
SURPLUS_HOLDERS = f"""
SELECT id::text FROM (
    SELECT e.id, e.concurrency_key, v.definition, {flowcontrol.KEY_LIMIT} AS key_limit,
           row_number() OVER (PARTITION BY e.workflow_id, e.concurrency_key
                              ORDER BY e.slot_at IS NULL DESC,
                                       coalesce(e.slot_at, e.created_at) DESC,
                                       e.id DESC) AS newest
    FROM (SELECT * FROM executions
          WHERE ({flowcontrol.LIVE_HOLDER}) OR ({flowcontrol.IN_QUEUE})) e
    JOIN workflow_versions v ON v.id = e.version_id
    WHERE e.concurrency_key IS NOT NULL
) h
WHERE newest > key_limit
  AND CASE WHEN concurrency_key = '{flowcontrol.SCHEDULE_KEY}'
           THEN definition->'trigger'->'schedule'->>'overlap' = 'cancel_other'
           ELSE definition->'concurrency'->>'on_full' = 'cancel_oldest' END
LIMIT 100
"""


class Reconciler:
    """Re-dispatches ready steps whose wake-up was lost."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        *,
        reconcile_s: float,
        head: QueueHead | None = None,
    ) -> None:
        self.pool = pool
        self.reconcile_s = reconcile_s
        self.head = head

    def reconcile(self) -> int:
        """Re-dispatch ready steps whose message went missing; hand on free concurrency
        slots that a transaction could not (a queued row it had to skip)."""
        with wrap_exceptions(), self.pool.connection() as conn:
            started = flowcontrol.fill_all(conn)
        if started:
            logger.warning("started queued executions on free slots", extra={"count": started})
        with wrap_exceptions(), self.pool.connection() as conn:
            surplus = tuple(row[0] for row in conn.execute(SURPLUS_HOLDERS).fetchall())
            if surplus:
                logger.warning("stopping surplus slot holders", extra={"count": len(surplus)})
                actions.stop_replaced(conn, surplus, actor=FLOW_CONTROL_ACTOR)
        with wrap_exceptions(), self.pool.connection() as conn:
            with conn.transaction():
                reached = None if self.head is None else self.head.reached(self.reconcile_s)
                params = {
                    "after_s": self.reconcile_s,
                    "max_doublings": MAX_DOUBLINGS,
                    "reached": reached,
                }
                count, failed_before = one(conn.execute(REDISPATCH, params))
            with conn.transaction():
                (parents,) = one(conn.execute(children.LOST_WAKEUPS, {"after_s": self.reconcile_s}))
            if count or parents:
                notify_relay(conn)
            if count:
                logger.warning(
                    "re-dispatched ready steps with lost wake-ups",
                    extra={"count": count, "failed_before": failed_before},
                )
            if parents:
                # docs/contract.md#child-workflows: a child ended, and its parent's wake-up went
                # missing.
                logger.warning("woke parents of ended children again", extra={"count": parents})
        return int(count)
