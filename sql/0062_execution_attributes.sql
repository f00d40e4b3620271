-- Search attributes (docs/contract.md#search-attributes): the named values a workflow
-- version declares (`attributes`), rendered from the webhook's body when the execution is
-- created and written in the same statement (flowforge/store/creation.py), so an operator
-- finds "the execution of order 4711" with one index range scan instead of scanning
-- inputs. A version that declares none writes no row and runs no statement more.
-- Never updated; deleted with their execution (retention) by ON DELETE CASCADE.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0062_execution_attributes');

CREATE TABLE execution_attributes (
    execution_id uuid NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    name         text NOT NULL CHECK (name ~ '^[a-z][a-z0-9_]{0,39}$'),
    value        text NOT NULL CHECK (length(value) BETWEEN 1 AND 200),
    PRIMARY KEY (execution_id, name)
);
-- A filter `name = value` is a range of this index, its execution ids in order: the list's
-- newest-first page walks it backwards (flowforge/store/search.py).
CREATE INDEX execution_attributes_lookup ON execution_attributes (name, value, execution_id);

COMMIT;
