"""The statements a worker chooses the step to take with under priorities
(docs/contract.md#priority): a better ready step than the one a wake-up names, the named
step's wake-up kept when another takes its turn, and whether the ready steps' priorities
differ at all."""

from __future__ import annotations

from flowforge.store.outbox import INSERT_WAKEUPS

# Priorities (docs/contract.md#priority, docs/explanation/priorities.md). RabbitMQ hands wake-ups
# out in the order they were published, so under a backlog the message at the head names an old
# step, whatever waits behind it. Before it takes that step, a worker asks for a better
# one: a ready step of a higher priority whose rank — ready_since (when it last became
# ready) minus priority * ageing_s — is earlier than the named step's. The ageing bounds
# how long a higher priority goes first: a step that has waited (p_high - p_low) *
# ageing_s longer ranks first again, so nothing starves.
#
# Indexable: within one priority the rank orders as ready_since, so steps_ready_priority
# (priority, ready_since) WHERE status = 'ready' (migration 0032) answers each priority with
# one range probe; `levels` walks the priorities above the named step's (a loose index
# scan, one probe per priority present, at most 200), and the best few of each are merged
# by rank. Its cost depends on how many priorities are present, not on the backlog
# (EXPLAIN over 50,000 ready steps: tests/integration/test_priorities.py). Steps the
# claim would only set aside are not offered: a paused execution's (resume dispatches
# them), one waiting for an outbound limit (its wait wakes it), one whose wake-ups
# failed (the reconciler backs off from it).
BETTER_READY = """
WITH RECURSIVE named AS (
    SELECT s.priority, s.ready_since - make_interval(secs => s.priority * %(ageing_s)s) AS rank
    FROM steps s
    WHERE s.execution_id = %(execution_id)s AND s.step_id = %(step_id)s AND s.status = 'ready'
), levels AS (
    SELECT (SELECT s.priority FROM steps s
            WHERE s.status = 'ready' AND s.priority > named.priority
            ORDER BY s.priority LIMIT 1)
    FROM named
    UNION ALL
    SELECT (SELECT s.priority FROM steps s
            WHERE s.status = 'ready' AND s.priority > levels.priority
            ORDER BY s.priority LIMIT 1)
    FROM levels WHERE levels.priority IS NOT NULL
)
SELECT c.execution_id, c.step_id
FROM named, levels,
     LATERAL (
         SELECT s.execution_id, s.step_id,
                s.ready_since - make_interval(secs => s.priority * %(ageing_s)s) AS rank
         FROM steps s
         WHERE s.status = 'ready' AND s.priority = levels.priority
           AND s.ready_since < named.rank + make_interval(secs => levels.priority * %(ageing_s)s)
           AND s.failed_wakeups = 0
           AND NOT EXISTS (SELECT FROM limit_waits w
                           WHERE w.execution_id = s.execution_id AND w.step_id = s.step_id)
           AND NOT EXISTS (SELECT FROM executions e
                           WHERE e.id = s.execution_id AND e.status = 'paused')
         ORDER BY s.ready_since
         LIMIT %(tries)s) c
WHERE levels.priority IS NOT NULL
ORDER BY c.rank
LIMIT %(tries)s
"""
# How many better steps one wake-up tries (each whose execution another session holds is
# skipped, never waited for) before it takes the step it names.
BETTER_TRIES = 8
# The named step keeps a wake-up of its own when another took its turn: written in the
# transaction of that claim, so every ready step still has a message
# (docs/contract.md#lost-messages), and the message the better step had becomes a duplicate, which
# changes nothing.
REDISPATCH = f"""
{INSERT_WAKEUPS}
SELECT %(execution_id)s, %(step_id)s
WHERE EXISTS (SELECT FROM steps
              WHERE execution_id = %(execution_id)s AND step_id = %(step_id)s
                AND status = 'ready')
"""
DEFAULT_AGEING_S = 10.0
# While every ready step has the same priority none can be better than another, and a
# wake-up need not ask (BETTER_READY is a round trip per step). A worker looks at the
# spread of the ready steps' priorities (both ends of steps_ready_priority) at most this
# often, in the first round trip of a unit of work that takes a step up (no round trip
# or commit of its own, issue 41): a high priority arriving is noticed by the first
# wake-up taken up this long after the last look.
SPREAD_EVERY_S = 0.1
READY_PRIORITY_SPREAD = "SELECT min(priority) <> max(priority) FROM steps WHERE status = 'ready'"
