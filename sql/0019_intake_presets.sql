-- SPEC §15 intake: provider signature presets beside Standard Webhooks and none
-- (flowforge/model.py WebhookAuth lists the same values; test_model_sql.py compares them).
-- The CHECK is replaced in one transaction; workflow_versions is small and its rows
-- already hold one of the old two values, so validation is a quick scan.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0019_intake_presets');
ALTER TABLE workflow_versions DROP CONSTRAINT workflow_versions_webhook_auth_check;
ALTER TABLE workflow_versions ADD CONSTRAINT workflow_versions_webhook_auth_check
    CHECK (webhook_auth IN ('none', 'signature', 'stripe', 'github', 'shopify', 'slack'));
COMMIT;
