-- An operator's cancel of an execution that another session holds locked — a worker
-- frozen inside a unit of work (SIGSTOP, a VM pause) until the server's timeout ends its
-- session — is recorded here and answered 202 at once instead of waiting on the lock and
-- answering 503. The reaper applies it by the cancel rules as soon as the row can be
-- locked, then deletes it (actions.apply_pending_cancels). No foreign key: its check
-- would take a KEY SHARE lock on the execution row, which the frozen FOR UPDATE holder
-- blocks; the reaper deletes the rows of executions that are gone.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0018_pending_cancels');
CREATE TABLE pending_cancels (
    execution_id uuid PRIMARY KEY,
    actor        jsonb NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now()
);
COMMIT;
