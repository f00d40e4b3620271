-- executions_live_status (0014) repeated what executions_by_status (0013) already holds:
-- the live rows' entries of (status, id) are the same rows, reached through the same
-- leading column, so the gauge queries that counted live executions (metrics.py
-- LIVE_EXECUTIONS, flowcontrol.py SLOT_GAUGES) read as few entries through it. Every
-- webhook paid for the second index with one more index entry to write and log.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0016_one_status_index');
DROP INDEX executions_live_status;
COMMIT;
