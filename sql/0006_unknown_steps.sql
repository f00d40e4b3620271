-- `?status=needs_attention` lists every execution with a step whose outcome is unknown,
-- whatever the execution's own status (a cancelled execution can keep an unknown step).
-- Unknown steps are few and wait for an operator: this partial index holds only them, so
-- the listing never scans the steps table.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0006_unknown_steps');
CREATE INDEX steps_unknown ON steps (execution_id) WHERE status = 'unknown';
COMMIT;
