-- Groups that never start must not stay forever (SPEC §15, flowforge/worker/retention.py).
-- A `failed` group (its workflow was archived, or its concurrency key did not render) is
-- deleted with its events once its workflow's retention_days passed since it failed
-- (intake_groups_failed finds them per workflow, oldest first). A group cannot outlive
-- its workflow's row either: the foreign key deletes a deleted workflow's groups, which
-- the scheduler could otherwise never claim (CLAIM_DUE joins workflows) nor forget.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0030_intake_groups_retention');
DELETE FROM intake_groups g WHERE NOT EXISTS (SELECT 1 FROM workflows w WHERE w.id = g.workflow_id);
ALTER TABLE intake_groups ADD CONSTRAINT intake_groups_workflow_id_fkey
    FOREIGN KEY (workflow_id) REFERENCES workflows (id) ON DELETE CASCADE;
CREATE INDEX intake_groups_failed ON intake_groups (workflow_id, started_at)
    WHERE status = 'failed';
COMMIT;
