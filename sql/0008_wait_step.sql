-- Wait steps (SPEC §10): the resumes their callers sent.
--
-- The resume token itself is never stored: it is derived from the execution and step
-- under FLOWFORGE_RESUME_KEY (flowforge/waits.py). A row is the first resume of one wait
-- step: its body (the step's output when applied), and the SHA-256 of its raw bytes,
-- which tells a replay (same body: 200) from a conflict (another body: 409). A resume
-- that arrives before its step is ready waits here with applied_at NULL and is taken,
-- under the execution row lock, when the step starts: no early resume is lost.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0008_wait_step');
CREATE TABLE resumes (
    execution_id uuid NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    step_id      text NOT NULL,
    body_sha256  bytea NOT NULL,
    body         jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    applied_at   timestamptz,
    PRIMARY KEY (execution_id, step_id)
);
COMMIT;
