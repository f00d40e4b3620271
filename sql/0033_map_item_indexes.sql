-- A map of 10,000 items (SPEC §16) must not cost its execution page or its worker's units
-- of work a read of every item's rows (`lines[3].reserve`: a step id with a '['):
--
-- steps_items_unsettled holds only item rows that are not succeeded or skipped: the ones
-- in flight, queued again by a retry, failed, cancelled or unknown. A unit of work loads
-- the open items' rows through it (runs.LOAD_OPEN_STEPS), and the read model counts items
-- by status from it (timeline.ITEM_TROUBLE): every other started item succeeded.
--
-- steps_top, attempts_top and execution_events_top hold the workflow's own rows (not an
-- item's): the execution page reads its steps, attempts and history through them instead
-- of filtering the items' tens of thousands of rows out of the execution's.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0033_map_item_indexes');
CREATE INDEX steps_items_unsettled ON steps (execution_id, step_id)
    WHERE strpos(step_id, '[') > 0 AND status NOT IN ('succeeded', 'skipped');
CREATE INDEX steps_top ON steps (execution_id, position) WHERE strpos(step_id, '[') = 0;
CREATE INDEX attempts_top ON attempts (execution_id, id) WHERE strpos(step_id, '[') = 0;
CREATE INDEX execution_events_top ON execution_events (execution_id, id)
    WHERE step_id IS NULL OR strpos(step_id, '[') = 0;
COMMIT;
