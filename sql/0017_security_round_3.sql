-- Security round 3 (SPEC §12).
--
-- Idempotency keys get a key space, `origin` (model.KeyOrigin): `client` for every key a
-- webhook sender supplies (Idempotency-Key, webhook-id), `system` for every identity
-- FlowForge makes for itself (a schedule tick's `schedule:<instant>`, later retries,
-- resumes, re-ingests). The origin is part of the primary key, so a client that posts
-- `Idempotency-Key: schedule:<next instant>` claims a key of its own and can neither
-- suppress the tick nor be handed its execution. Existing keys of schedule executions
-- move to `system`; every other existing key stays the client's.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0017_security_round_3');
ALTER TABLE idempotency_keys
    ADD COLUMN origin text NOT NULL DEFAULT 'client' CHECK (origin IN ('client', 'system'));
UPDATE idempotency_keys k SET origin = 'system'
FROM executions e
WHERE e.id = k.execution_id AND e.trigger = 'schedule';
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD PRIMARY KEY (workflow_id, origin, key);
COMMIT;
