-- Webhook signing secrets are stored sealed (AES-256-GCM, see flowforge/sealing.py); the
-- key never enters the database, so a dump alone cannot forge webhooks.
-- SQL cannot know the key: rows written before this migration keep their clear value
-- until bin/migrate (run with FLOWFORGE_ENCRYPTION_KEY set) seals them and empties
-- `secret`. Every row holds exactly one of the two forms; new rows only the sealed one.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0004_seal_webhook_secrets');
ALTER TABLE webhook_secrets ADD COLUMN sealed bytea;
ALTER TABLE webhook_secrets ALTER COLUMN secret DROP NOT NULL;
ALTER TABLE webhook_secrets
    ADD CONSTRAINT webhook_secrets_one_form CHECK (num_nonnulls(secret, sealed) = 1);
COMMENT ON COLUMN webhook_secrets.secret IS 'legacy clear value; emptied by bin/migrate';
COMMENT ON COLUMN webhook_secrets.sealed IS
    'version byte, 12-byte nonce, AES-256-GCM ciphertext+tag; AAD names workflow and id';
COMMIT;
