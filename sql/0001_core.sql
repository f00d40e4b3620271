-- FlowForge core schema. Forward-only: never edit this file once it has landed.
-- Applies by hand with: psql -v ON_ERROR_STOP=1 -f sql/0001_core.sql
BEGIN;

CREATE TABLE IF NOT EXISTS schema_migrations (
    version    text PRIMARY KEY,
    checksum   text,            -- sha256 of the file; bin/migrate fills it when applied by hand
    applied_at timestamptz NOT NULL DEFAULT now()
);
-- Fails (and rolls the whole file back) when this migration was already applied.
INSERT INTO schema_migrations (version) VALUES ('0001_core');

-- Operator credentials for /api/v1. Only the SHA-256 of a key is stored.
CREATE TABLE api_keys (
    id           bigserial PRIMARY KEY,
    name         text NOT NULL,
    key_hash     bytea NOT NULL UNIQUE,
    key_prefix   text NOT NULL,               -- first characters, to recognise a key in listings
    workflows    text[],                      -- NULL: every workflow; else only these keys
    read_only    boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);

CREATE TABLE workflows (
    id             bigserial PRIMARY KEY,
    key            text NOT NULL UNIQUE CHECK (key ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    latest_version integer NOT NULL DEFAULT 0,  -- bumped atomically by each publish
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- room for what comes next: per-workflow concurrency limits and backpressure
    max_concurrency integer CHECK (max_concurrency > 0),
    archived_at    timestamptz
);

-- Immutable once written: executions pin a row of this table for life.
CREATE TABLE workflow_versions (
    id           bigserial PRIMARY KEY,
    workflow_id  bigint NOT NULL REFERENCES workflows (id),
    version      integer NOT NULL,
    name         text NOT NULL,
    definition   jsonb NOT NULL,
    webhook_auth text NOT NULL CHECK (webhook_auth IN ('signature', 'none')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   bigint REFERENCES api_keys (id),
    UNIQUE (workflow_id, version)
);

-- Standard Webhooks signing secrets; at most two active per workflow (enforced under
-- the workflow row lock) so senders can rotate without downtime.
CREATE TABLE webhook_secrets (
    id          bigserial PRIMARY KEY,
    workflow_id bigint NOT NULL REFERENCES workflows (id),
    secret      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX webhook_secrets_active ON webhook_secrets (workflow_id) WHERE revoked_at IS NULL;

CREATE TABLE executions (
    id                  uuid PRIMARY KEY,
    workflow_id         bigint NOT NULL REFERENCES workflows (id),
    version_id          bigint NOT NULL REFERENCES workflow_versions (id),
    status              text NOT NULL CHECK (status IN ('queued', 'running', 'waiting',
                            'needs_attention', 'succeeded', 'failed', 'cancelled')),
    input               jsonb NOT NULL,
    trigger             text NOT NULL DEFAULT 'webhook',   -- later: 'cron', 'api'
    idempotency_key     text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    finished_at         timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    cancel_requested_at timestamptz,
    deadline_at         timestamptz                         -- later: run deadlines
);
-- Keyset pagination, newest first, overall and per workflow / status.
CREATE INDEX executions_by_created ON executions (created_at DESC, id DESC);
CREATE INDEX executions_by_workflow ON executions (workflow_id, created_at DESC, id DESC);
CREATE INDEX executions_live ON executions (status)
    WHERE status NOT IN ('succeeded', 'failed', 'cancelled');

-- One row per step of an execution. Every writer first locks the execution row, so the
-- DAG progression of one execution is serialised while executions stay independent.
CREATE TABLE steps (
    execution_id     uuid NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    step_id          text NOT NULL,
    type             text NOT NULL,
    position         integer NOT NULL,             -- place in the definition's order
    status           text NOT NULL CHECK (status IN ('pending', 'ready', 'running', 'waiting',
                         'succeeded', 'failed', 'skipped', 'unknown', 'cancelled')),
    attempts         integer NOT NULL DEFAULT 0,   -- tries used in the current run of the step
    fencing_token    bigint NOT NULL DEFAULT 0,    -- bumped by every claim; writes must match
    lease_owner      text,
    lease_expires_at timestamptz,
    wake_at          timestamptz,                  -- delays and retry back-off
    ready_at         timestamptz,                  -- when its wake-up was last dispatched
    output           jsonb,
    error            text,
    started_at       timestamptz,
    finished_at      timestamptz,
    PRIMARY KEY (execution_id, step_id)
);
CREATE INDEX steps_waiting ON steps (wake_at) WHERE status = 'waiting';
CREATE INDEX steps_running ON steps (lease_expires_at) WHERE status = 'running';
CREATE INDEX steps_ready ON steps (ready_at) WHERE status = 'ready';

-- One row per try. Written (and committed) before an HTTP request leaves.
CREATE TABLE attempts (
    id            bigserial PRIMARY KEY,
    execution_id  uuid NOT NULL,
    step_id       text NOT NULL,
    attempt       integer NOT NULL,
    fencing_token bigint NOT NULL,
    worker        text,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    outcome       text CHECK (outcome IN ('succeeded', 'failed', 'unknown', 'lost_lease')),
    error         text,
    http_status   integer,
    duration_ms   integer,
    FOREIGN KEY (execution_id, step_id) REFERENCES steps (execution_id, step_id)
        ON DELETE CASCADE
);
CREATE INDEX attempts_by_step ON attempts (execution_id, step_id, id);

-- Append-only history of every transition.
CREATE TABLE execution_events (
    id           bigserial PRIMARY KEY,
    execution_id uuid NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    step_id      text,
    kind         text NOT NULL,
    detail       jsonb
);
CREATE INDEX execution_events_by_execution ON execution_events (execution_id, id);

-- Wake-ups waiting to be published to RabbitMQ, written in the transaction that causes
-- them. The relay deletes a row only after the broker confirmed its message.
CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    execution_id uuid NOT NULL,
    step_id      text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Webhook idempotency, scoped to the workflow; kept at least 24 hours. No foreign key to
-- executions: retention removes both on their own schedules.
CREATE TABLE idempotency_keys (
    workflow_id  bigint NOT NULL,
    key          text NOT NULL,
    body_sha256  bytea NOT NULL,
    execution_id uuid NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, key)
);
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);

COMMIT;
