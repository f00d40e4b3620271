-- Flow control and time limits (SPEC §8).
--
-- Slots are derived from execution rows, never counted: an execution holds a slot of its
-- (workflow, concurrency_key) from `slot_at` until it is terminal or asked to stop, and
-- the statements that start executions count holders under a transaction-level advisory
-- lock of that key. A crash anywhere leaves rows that are true, so no slot can leak.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0007_flow_control');
-- NULL: the workflow version has no concurrency limit; '' when it has a limit but no key.
ALTER TABLE executions ADD COLUMN concurrency_key text;
-- When the execution was given a slot (NULL while it waits in its key's queue).
ALTER TABLE executions ADD COLUMN slot_at timestamptz;
-- start_within_s: still queued at this instant, the execution ends cancelled (expired).
ALTER TABLE executions ADD COLUMN expires_at timestamptz;
-- Why a stop was asked or an execution ended: cancelled, concurrency, deadline, expired.
ALTER TABLE executions ADD COLUMN stop_reason text;

-- The holders of each key's slots.
CREATE INDEX executions_slot_holders ON executions (workflow_id, concurrency_key)
    WHERE slot_at IS NOT NULL AND cancel_requested_at IS NULL
      AND status IN ('queued', 'running', 'waiting', 'needs_attention');
-- Each key's queue in arrival order (ids are time-ordered UUIDs).
CREATE INDEX executions_slot_queue ON executions (workflow_id, concurrency_key, created_at, id)
    WHERE slot_at IS NULL AND concurrency_key IS NOT NULL AND status = 'queued';
-- Durable wake times of deadlines and queue expiry, found by the timer scanner.
CREATE INDEX executions_deadline ON executions (deadline_at)
    WHERE deadline_at IS NOT NULL AND cancel_requested_at IS NULL
      AND status IN ('queued', 'running', 'waiting', 'needs_attention');
CREATE INDEX executions_expiry ON executions (expires_at)
    WHERE expires_at IS NOT NULL AND status = 'queued';
COMMIT;
