-- Slots are held until an execution is terminal, also while a cancel of it is in flight
-- (flowcontrol.holds_slot): the holders index of 0020 was partial on
-- `cancel_requested_at IS NULL` as well, which the holders count no longer implies, so the
-- count under a key's slot lock read every execution the workflow ever had. The index now
-- carries exactly the holders predicate; cancel_oldest's live holders are a subset of it.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0035_slot_holders_until_terminal');
DROP INDEX executions_slot_holders;
CREATE INDEX executions_slot_holders ON executions (workflow_id, concurrency_key)
    WHERE slot_at IS NOT NULL
      AND status IN ('queued', 'running', 'waiting', 'paused', 'needs_attention');
COMMIT;
