-- Debounce and batch (SPEC §15, flowforge/grouping.py). A webhook of a workflow whose
-- newest version has trigger.webhook.debounce or .batch is recorded here instead of
-- starting an execution: one `open` group per (workflow, kind, rendered key) collects its
-- events, and the worker's scheduler starts the group's one execution once it is due
-- (debounce: a quiet window or max_wait_s after the first event; batch: window_s after the
-- first event, or at once when max_items were collected). The group's execution id is
-- chosen when the group opens, so every event's 202 (and its idempotency key) names the
-- execution it was recorded against before that execution exists.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0029_intake_groups');
CREATE TABLE intake_groups (
    id            bigserial PRIMARY KEY,
    workflow_id   bigint NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('debounce', 'batch')),
    group_key     text NOT NULL,             -- the rendered key ('' for one group per workflow)
    -- open: takes events; closed: a full batch waiting to start; started: its execution
    -- exists; failed: it could not start (reason says why; the workflow was archived).
    status        text NOT NULL DEFAULT 'open'
                  CHECK (status IN ('open', 'closed', 'started', 'failed')),
    execution_id  uuid NOT NULL UNIQUE,      -- the execution it starts (or started)
    events        int NOT NULL DEFAULT 1,
    bytes         bigint NOT NULL DEFAULT 0,  -- its events' bodies (a batch closes at a cap)
    opened_at     timestamptz NOT NULL DEFAULT now(),
    last_at       timestamptz NOT NULL DEFAULT now(),
    due_at        timestamptz NOT NULL,      -- when the scheduler starts it
    deadline_at   timestamptz NOT NULL,      -- debounce: opened_at + max_wait_s; batch: due_at
    started_at    timestamptz,
    reason        text,
    -- Set when the execution is created: retention's delete of it deletes the group and
    -- its events (ON DELETE CASCADE through intake_groups_started).
    started_execution uuid REFERENCES executions (id) ON DELETE CASCADE
);
-- One open group per key: concurrent events of one key meet on this index (the intake's
-- INSERT ... ON CONFLICT DO UPDATE), and a group that closes or starts leaves it.
CREATE UNIQUE INDEX intake_groups_open ON intake_groups (workflow_id, kind, group_key)
    WHERE status = 'open';
-- The scheduler's claim of due groups.
CREATE INDEX intake_groups_due ON intake_groups (due_at) WHERE status IN ('open', 'closed');
CREATE INDEX intake_groups_started ON intake_groups (started_execution)
    WHERE started_execution IS NOT NULL;
CREATE INDEX intake_groups_workflow ON intake_groups (workflow_id, id);
CREATE TABLE intake_group_events (
    id              bigserial PRIMARY KEY,
    group_id        bigint NOT NULL REFERENCES intake_groups (id) ON DELETE CASCADE,
    received_at     timestamptz NOT NULL DEFAULT now(),
    idempotency_key text,                    -- the event's identity, if it had one
    body            jsonb NOT NULL
);
CREATE INDEX intake_group_events_group ON intake_group_events (group_id, id);
COMMIT;
