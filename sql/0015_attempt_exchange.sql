-- What each attempt of an http_request step sent and got back, for the console and
-- GET /api/v1/executions/{id}: the step keeps only its last response, and an `unknown`
-- attempt must show exactly what left. Both are redacted like step outputs (no secret,
-- no wait resume token) and their bodies capped (flowforge/http_step.py,
-- ATTEMPT_BODY_BYTES). `request` is written with the claim, before the request leaves;
-- `response` when the attempt finishes with an answer. NULL for pure steps, attempts
-- that got no answer, and rows older than this migration. Nullable without a default:
-- adding them rewrites nothing.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0015_attempt_exchange');
ALTER TABLE attempts ADD COLUMN request jsonb, ADD COLUMN response jsonb;
COMMIT;
