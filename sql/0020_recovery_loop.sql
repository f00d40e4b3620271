-- The recovery loop (SPEC §14): pause and resume, pause instead of fail, replay.
--
-- An execution can be `paused`. `paused_from` is the status it had when it was paused
-- (what resume gives back: `queued`, `running` or `waiting`), `pause_reason` says why:
-- `operator` (one execution), `workflow` (its workflow was paused) or `exhausted` (a
-- step's retries ran out under retry.on_exhausted "pause"). A paused execution keeps a
-- concurrency slot it holds and is still stopped by its deadline; one paused while it
-- waited in the queue still expires by start_within_s, so the partial indexes of slot
-- holders, deadlines and expiries are rebuilt with `paused` in them.
--
-- A paused workflow (`workflows.paused_at`, `paused_by` the actor) still accepts
-- webhooks; nothing of it starts or continues until it is resumed.
--
-- A replay is a new execution with `replay_of` (the original) and `replay_from` (the
-- step it was replayed from); the original's `replayed_by` is read through the index.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0020_recovery_loop');

ALTER TABLE executions DROP CONSTRAINT executions_status_check;
ALTER TABLE executions ADD CONSTRAINT executions_status_check CHECK (status IN (
    'queued', 'running', 'waiting', 'paused', 'needs_attention', 'succeeded', 'failed',
    'cancelled'));
ALTER TABLE executions ADD COLUMN paused_from text
    CHECK (paused_from IN ('queued', 'running', 'waiting', 'needs_attention'));
ALTER TABLE executions ADD COLUMN pause_reason text
    CHECK (pause_reason IN ('operator', 'workflow', 'exhausted'));
ALTER TABLE executions ADD COLUMN replay_of uuid;
ALTER TABLE executions ADD COLUMN replay_from text;
CREATE INDEX executions_replays ON executions (replay_of) WHERE replay_of IS NOT NULL;

ALTER TABLE workflows ADD COLUMN paused_at timestamptz;
ALTER TABLE workflows ADD COLUMN paused_by jsonb;

DROP INDEX executions_slot_holders;
CREATE INDEX executions_slot_holders ON executions (workflow_id, concurrency_key)
    WHERE slot_at IS NOT NULL AND cancel_requested_at IS NULL
      AND status IN ('queued', 'running', 'waiting', 'paused', 'needs_attention');
DROP INDEX executions_deadline;
CREATE INDEX executions_deadline ON executions (deadline_at)
    WHERE deadline_at IS NOT NULL AND cancel_requested_at IS NULL
      AND status IN ('queued', 'running', 'waiting', 'paused', 'needs_attention');
DROP INDEX executions_expiry;
CREATE INDEX executions_expiry ON executions (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('queued', 'paused');
COMMIT;
