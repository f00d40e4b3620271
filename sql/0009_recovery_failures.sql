-- How often lease recovery failed for a running step since the step last changed (SPEC §7).
-- A step whose recovery fails deterministically was set aside again and again, running
-- with no owner forever; after a few failures it is settled as `unknown` instead, so an
-- operator sees it. A constant default: no table rewrite.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0009_recovery_failures');
ALTER TABLE steps ADD COLUMN recovery_failures integer NOT NULL DEFAULT 0;
COMMIT;
