-- Archive and re-ingest (SPEC §14, flowforge/archive.py). When a workflow's newest version
-- has archive_days > 0, the intake statement also writes each accepted webhook's raw
-- request here: the body exactly as received and an allow-list of headers (content type,
-- provider delivery/event ids; never Authorization, a cookie or a signature header), and
-- how it was verified (the auth scheme and the id of the secret that verified it, never
-- the secret). No foreign keys: an execution and its delivery have their own retentions
-- (retention_days, archive_days), and either may outlive the other.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0025_webhook_archive');
CREATE TABLE webhook_deliveries (
    id           bigserial PRIMARY KEY,
    workflow_id  bigint NOT NULL,
    execution_id uuid NOT NULL,            -- the execution its intake made
    received_at  timestamptz NOT NULL DEFAULT now(),
    body         bytea NOT NULL,
    headers      jsonb NOT NULL DEFAULT '{}',
    auth_scheme  text NOT NULL,
    secret_id    bigint                    -- which secret verified it; NULL for auth none
);
-- Re-ingest reads a workflow's range in id order; retention deletes the oldest first.
CREATE INDEX webhook_deliveries_workflow ON webhook_deliveries (workflow_id, received_at, id);
CREATE INDEX webhook_deliveries_received ON webhook_deliveries (received_at);
-- The delivery an execution was made from: its own intake's, or the one it re-ingests.
ALTER TABLE executions ADD COLUMN delivery_id bigint;
CREATE INDEX executions_delivery ON executions (delivery_id) WHERE delivery_id IS NOT NULL;
COMMIT;
