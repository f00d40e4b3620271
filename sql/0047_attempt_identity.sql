-- Every attempt gets an identity no failover can re-issue (docs/howto/several-hosts.md,
-- "After an asynchronous failover"). A fencing token only counts claims on one timeline:
-- when a claim never reached the standby, the promoted one hands out the same
-- (execution, step, token) again, and the failover report could not tell the old
-- attempt from the new. A random uuid drawn in the claim's transaction can. Rows written
-- before this migration keep NULL (the report falls back to token and start time); the
-- column is added without a default first so that no existing row is rewritten.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0047_attempt_identity');
ALTER TABLE attempts ADD COLUMN identity uuid;
ALTER TABLE attempts ALTER COLUMN identity SET DEFAULT gen_random_uuid();
COMMIT;
