-- Webhooks routed through a source are archived like a workflow's own (SPEC §14,
-- flowforge/archive.py): one row per execution the event started, with the source that
-- verified it. `source_id` NULL: the workflow's own /hooks/<key>, and `secret_id` names a
-- webhook_secrets row; set: `secret_id` names a source_secrets row of that source. No
-- foreign key, as for the rest of the archive (its own retention).
-- source_unmatched gets the indexes housekeeping deletes it by (worker/retention.py:
-- events no subscription matched are kept 30 days and at most the newest 10,000 per
-- source, then deleted oldest first).
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0028_source_archive_and_unmatched_retention');
ALTER TABLE webhook_deliveries ADD COLUMN source_id bigint;
CREATE INDEX source_unmatched_received ON source_unmatched (received_at);
CREATE INDEX source_unmatched_source ON source_unmatched (source_id, id);
COMMIT;
