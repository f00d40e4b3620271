-- A version's definition as its author wrote it, key order included. `definition` is
-- jsonb, which keeps keys in an order of its own (shorter keys first), so a definition
-- read back showed `trigger` after `steps`, and the console's version diff reported keys
-- PostgreSQL had moved. `json` keeps the text as sent. NULL for versions published before
-- this migration, whose author's order is gone: they are read from `definition`.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0024_definition_source');
ALTER TABLE workflow_versions ADD COLUMN source json;
COMMIT;
