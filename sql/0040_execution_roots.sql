-- Child workflow fan-out is bounded per root (docs/reference/definition.md, workflow
-- steps; FLOWFORGE_MAX_DESCENDANTS). Each child names the root of its tree — the
-- execution a webhook, a tick or an operator started — so the descendants of a root are
-- counted through one index (executions_roots), under an advisory lock on the root, in
-- the unit of work that would start more. NULL for a root itself. Existing children get
-- their root from their chain of parents.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0040_execution_roots');
ALTER TABLE executions ADD COLUMN root_id uuid;
WITH RECURSIVE tree AS (
    SELECT c.id, c.parent_id AS root_id FROM executions c
    JOIN executions p ON p.id = c.parent_id WHERE p.parent_id IS NULL
    UNION ALL
    SELECT c.id, tree.root_id FROM executions c JOIN tree ON c.parent_id = tree.id
)
UPDATE executions e SET root_id = tree.root_id FROM tree WHERE e.id = tree.id;
CREATE INDEX executions_roots ON executions (root_id) WHERE root_id IS NOT NULL;
COMMIT;
