-- Execution ids are UUIDv7 (time-ordered), so the primary key serves "newest first"
-- keyset pagination; every index dropped here is one less write per webhook.
-- executions_live answered no query.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0003_executions_keyset_by_id');
DROP INDEX executions_by_created;
DROP INDEX executions_live;
DROP INDEX executions_by_workflow;
CREATE INDEX executions_by_workflow ON executions (workflow_id, id DESC);
COMMIT;
