-- The console (SPEC §11): its sign-in sessions, and an index for each filter of its
-- executions list.
--
-- A session row is what a signed-in browser's cookie stands for. Only the SHA-256 of the
-- cookie's token is stored, next to the API key it signed in with and the CSRF token its
-- forms carry; a session is honoured only while its key is not revoked, so revoking a key
-- ends every console session it opened.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0013_console_sessions');
CREATE TABLE console_sessions (
    token_hash bytea PRIMARY KEY,
    api_key_id bigint NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    csrf_token text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);

-- The executions list filters by status (with or without a workflow), newest first by
-- id (UUIDv7, so a time range is an id range and needs no index of its own).
CREATE INDEX executions_by_status ON executions (status, id DESC);
CREATE INDEX executions_by_workflow_status ON executions (workflow_id, status, id DESC);
-- An idempotency key names at most a few executions per workflow.
CREATE INDEX executions_by_idempotency_key ON executions (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- "input path = value" is containment (input @> '{"a": {"b": "v"}}'), which jsonb_path_ops
-- answers with an index a third the size of the default GIN operator class.
CREATE INDEX executions_by_input ON executions USING gin (input jsonb_path_ops);
COMMIT;
