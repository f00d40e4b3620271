-- The live executions by status, for the metrics gauge flowforge_executions (SPEC §11:
-- no metric scans a whole table). Only live rows are in it: a finished execution leaves
-- it with the update that finishes it, so it stays as small as the work in progress
-- however many finished executions the table holds. Its predicate is the one of the
-- gauge query in flowforge/metrics.py (LIVE_EXECUTIONS) and of flowcontrol's SLOT_GAUGES.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0014_live_executions_index');
CREATE INDEX executions_live_status ON executions (status)
    WHERE status IN ('queued', 'running', 'waiting', 'needs_attention');
COMMIT;
