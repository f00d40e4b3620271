-- Publishing a definition that uses {{ secrets.NAME }} needs a key that may do so: a key
-- scoped to one workflow must not be able to read any secret by pointing a request at a
-- host it controls. Existing keys do not get the permission; grant it with a new key
-- (`flowforge apikey create --secrets`).
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0005_api_key_secrets_permission');
ALTER TABLE api_keys ADD COLUMN publish_secrets boolean NOT NULL DEFAULT false;
COMMIT;
