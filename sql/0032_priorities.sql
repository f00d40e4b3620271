-- Priorities (SPEC §16, docs/explanation/priorities.md). An execution's priority is fixed
-- when it is created (a definition's literal `priority`, or its template rendered from the
-- input) and copied onto each of its step rows, so that the claim can rank ready steps
-- from one index.
--
-- steps.ready_since: when the step last became ready (NULL unless it is ready). Not
-- ready_at, which is when its wake-up was last dispatched: the reconciler moves that on
-- every time it dispatches a step again, and a step that waits behind a backlog would
-- never age. Set by every writer that makes a step ready (creation, schedules, flow
-- control, timers, runs.SAVE_RUN), never by a re-dispatch.
--
-- steps_ready_priority holds the ready steps by (priority, ready_since). Within one
-- priority the oldest ready step is the best; across priorities the worker compares
-- ready_since - priority * FLOWFORGE_PRIORITY_AGEING_S (the ageing), one index probe per
-- priority present (flowforge/worker/executor.py, BETTER_READY). The ageing is a setting,
-- not part of the index, so changing it needs no migration.
--
-- Priorities default to 0: adding the columns rewrites nothing, and every existing row
-- keeps the order it had (one priority: oldest ready first).
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0032_priorities');
ALTER TABLE executions ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CONSTRAINT executions_priority_range CHECK (priority BETWEEN -100 AND 100);
ALTER TABLE steps ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN ready_since timestamptz;
UPDATE steps SET ready_since = ready_at WHERE status = 'ready';
CREATE INDEX steps_ready_priority ON steps (priority, ready_since) WHERE status = 'ready';
COMMIT;
