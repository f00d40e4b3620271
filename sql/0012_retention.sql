-- Retention (SPEC §11): finished executions older than their workflow's retention_days
-- are deleted in batches by the workers' housekeeping (flowforge/worker/retention.py).
--
-- Candidates are found per workflow, oldest finished first, without reading the rest of
-- the table: only succeeded, failed and cancelled executions are in these indexes
-- (needs_attention and live ones never are). Executions with an idempotency key are kept
-- while their key is remembered (a duplicate webhook is still answered with the original
-- execution), so they are found with a later cutoff: they have an index of their own,
-- and those the key still protects never sit in front of unkeyed candidates. Each
-- execution is in at most one of the two, entering it once, when it finishes.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0012_retention');
CREATE INDEX executions_finished ON executions (workflow_id, finished_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled') AND idempotency_key IS NULL;
CREATE INDEX executions_finished_keyed ON executions (workflow_id, finished_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled') AND idempotency_key IS NOT NULL;
COMMIT;
