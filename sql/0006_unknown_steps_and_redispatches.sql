-- Two promises of SPEC §7.
--
-- `?status=needs_attention` lists every execution with a step whose outcome is unknown,
-- whatever the execution's own status (a cancelled execution can keep an unknown step).
-- Unknown steps are few and wait for an operator: this partial index holds only them, so
-- the listing never scans the steps table.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0006_unknown_steps_and_redispatches');
CREATE INDEX steps_unknown ON steps (execution_id) WHERE status = 'unknown';
-- How often the reconciler re-dispatched a ready step since the step last changed: each
-- time it waits twice as long, so a wake-up that keeps failing (and is dead-lettered) is
-- not sent again every reconcile interval forever. A constant default: no table rewrite.
ALTER TABLE steps ADD COLUMN redispatches integer NOT NULL DEFAULT 0;
COMMIT;
