-- Every webhook's insert into executions checked its foreign keys by locking the one
-- workflows row and the one workflow_versions row all executions of a workflow share:
-- WAL on each lock and MultiXact churn under concurrency (see bin/bench). Workflows and
-- versions are immutable and never deleted, so the application keeps this integrity.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0002_drop_hot_foreign_keys');
ALTER TABLE executions DROP CONSTRAINT executions_workflow_id_fkey;
ALTER TABLE executions DROP CONSTRAINT executions_version_id_fkey;
COMMIT;
