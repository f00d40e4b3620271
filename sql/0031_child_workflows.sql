-- Child workflows (SPEC §16): a `workflow` step starts an execution of another workflow
-- and waits for it. The child names its parent (execution and step) and how deep it is;
-- the parent finds its children through executions_children. No foreign key to the
-- parent: its KEY SHARE check would wait on the parent's FOR UPDATE, and the two are
-- deleted by retention on their own schedules.
-- steps_waiting_children: the reconciler's scan for a parent whose wake-up was lost.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0031_child_workflows');
ALTER TABLE executions
    ADD COLUMN parent_id   uuid,
    ADD COLUMN parent_step text,
    ADD COLUMN depth       integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT executions_parent_check
        CHECK ((parent_id IS NULL) = (parent_step IS NULL) AND depth >= 0);
CREATE INDEX executions_children ON executions (parent_id, created_at)
    WHERE parent_id IS NOT NULL;
CREATE INDEX steps_waiting_children ON steps (execution_id)
    WHERE type = 'workflow' AND status = 'waiting';
COMMIT;
