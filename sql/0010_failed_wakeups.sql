-- The reconciler's back-off counts failed handlings, not re-dispatches (SPEC §7: a lost
-- wake-up is caught by the reconciler). A wake-up the broker lost was never handled, and
-- under a blackholed or stranded broker link that can happen again and again: such a
-- step must be re-dispatched every reconcile interval. Only a wake-up that failed and was
-- dead-lettered (the consumer counts it here) makes the next re-dispatch wait twice as
-- long. Counts of re-dispatches say nothing about failures: they start again from zero.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0010_failed_wakeups');
ALTER TABLE steps RENAME COLUMN redispatches TO failed_wakeups;
UPDATE steps SET failed_wakeups = 0 WHERE failed_wakeups <> 0;
COMMIT;
