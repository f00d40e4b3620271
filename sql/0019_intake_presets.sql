-- SPEC §15 intake: provider signature presets beside Standard Webhooks and none
-- (flowforge/model.py WebhookAuth lists the same values; test_model_sql.py compares them).
-- The CHECK is replaced in one transaction; workflow_versions is small and its rows
-- already hold one of the old two values, so validation is a quick scan.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0019_intake_presets');
ALTER TABLE workflow_versions DROP CONSTRAINT workflow_versions_webhook_auth_check;
ALTER TABLE workflow_versions ADD CONSTRAINT workflow_versions_webhook_auth_check
    CHECK (webhook_auth IN ('none', 'signature', 'stripe', 'github', 'shopify', 'slack'));

-- Sources (SPEC §15 routing): one /hooks/<name> endpoint whose subscriptions start
-- executions of several workflows. A source's name shares the /hooks/ namespace with
-- workflow keys (same pattern; the API refuses a name the other table holds, both under
-- one advisory lock). `revision` is bumped by every change, so an API process's cached
-- copy is proven current inside the intake transaction, as intake targets are.
CREATE TABLE sources (
    id            bigserial PRIMARY KEY,
    name          text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    auth          text NOT NULL
                  CHECK (auth IN ('none', 'signature', 'stripe', 'github', 'shopify', 'slack')),
    subscriptions jsonb NOT NULL CHECK (jsonb_typeof(subscriptions) = 'array'),
    revision      integer NOT NULL DEFAULT 1,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
-- A source's signing secrets: sealed like webhook_secrets (the associated data names this
-- table), at most two active.
CREATE TABLE source_secrets (
    id         bigserial PRIMARY KEY,
    source_id  bigint NOT NULL REFERENCES sources (id),
    sealed     bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX source_secrets_active ON source_secrets (source_id) WHERE revoked_at IS NULL;
-- Events no subscription matched: answered 202 with no execution, kept here so none is
-- lost silently (one row per delivery identity; a redelivery adds nothing).
CREATE TABLE source_unmatched (
    id          bigserial PRIMARY KEY,
    source_id   bigint NOT NULL REFERENCES sources (id),
    identity    text,
    input       jsonb NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX source_unmatched_identity ON source_unmatched (source_id, identity)
    WHERE identity IS NOT NULL;
COMMIT;
