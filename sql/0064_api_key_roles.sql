-- Roles (docs/contract.md#roles): every API key gets a role, viewer, operator or admin,
-- and the role is the one source of truth of what it may do (read_only is gone; the API
-- and CLI still take read_only/--read-only and mean viewer). Existing keys keep exactly
-- their powers: a read-only key becomes a viewer, a read-write key an admin (it could
-- publish, manage secrets, sources, notification endpoints and limits). publish_secrets
-- stays a separate grant on top of admin, the only role that publishes; a read-only key
-- that had it could never use it, so it is dropped there and the CHECK keeps it so.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0064_api_key_roles');
ALTER TABLE api_keys ADD COLUMN role text;
UPDATE api_keys SET role = CASE WHEN read_only THEN 'viewer' ELSE 'admin' END,
                    publish_secrets = publish_secrets AND NOT read_only;
ALTER TABLE api_keys
    ALTER COLUMN role SET NOT NULL,
    ADD CONSTRAINT api_keys_role CHECK (role IN ('viewer', 'operator', 'admin')),
    ADD CONSTRAINT api_keys_secrets_need_admin CHECK (NOT publish_secrets OR role = 'admin'),
    DROP COLUMN read_only;
COMMIT;
