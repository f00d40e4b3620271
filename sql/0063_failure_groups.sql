-- Failure groups (docs/contract.md#failure-groups): failed and `unknown` executions of one
-- workflow's step with one error signature (flowforge/domain/failures.py) are one group,
-- counted with its first and last sighting, that an operator resolves, ignores or reopens
-- and replays or retries whole. The group is upserted in the unit of work that records the
-- failure (store/runs.SAVE_RUN_FAILING), which links the execution through
-- executions.failure_group_id in the same UPDATE of its row; a successful unit of work runs
-- the statement it always ran. A new group, or a resolved one that recurs, is opened: its
-- opened_xact is the transaction that opened it, which the trigger below (switched with
-- the others of sql/0060 by store/notifications.sync_triggers) turns into one
-- `failure_group.opened` notification, not one per execution.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0063_failure_groups');

CREATE TABLE failure_groups (
    id                bigserial PRIMARY KEY,
    workflow_id       bigint NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    -- The step that failed ('' when the execution failed with no step failing: a deadline);
    -- a map item's row with its index taken out ("items[].charge").
    step_id           text NOT NULL,
    signature         text NOT NULL,
    outcome           text NOT NULL CHECK (outcome IN ('failed', 'unknown')),
    status_class      text,
    code              integer,
    kind              text NOT NULL,
    message           text NOT NULL,
    status            text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved', 'ignored')),
    count             bigint NOT NULL DEFAULT 1,
    first_seen        timestamptz NOT NULL DEFAULT now(),
    last_seen         timestamptz NOT NULL DEFAULT now(),
    opened_at         timestamptz NOT NULL DEFAULT now(),
    opened_xact       xid8 NOT NULL DEFAULT pg_current_xact_id(),
    last_execution_id uuid NOT NULL,
    status_at         timestamptz,
    status_by         jsonb,
    UNIQUE (workflow_id, step_id, signature)
) WITH (fillfactor = 50);  -- room on each page for the HOT updates below
-- No index on last_seen, status or count: every failure of a group updates its row, and an
-- update that changes no indexed column is a HOT update (no new index entries, dead
-- versions pruned on the page), so a group's thousandth failure costs what its first did.
-- There are few groups: listing them sorts them without an index.

-- No foreign key on the hot executions table (migration 0002); a group outlives the
-- executions retention deletes. Only failed or unknown executions carry one.
ALTER TABLE executions ADD COLUMN failure_group_id bigint;
CREATE INDEX executions_by_failure_group ON executions (failure_group_id, id)
    WHERE failure_group_id IS NOT NULL;

CREATE FUNCTION notify_failure_group_opened() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM notify_record('failure_group.opened', NEW.workflow_id, NEW.last_execution_id,
        jsonb_build_object('group', NEW.id, 'step', NEW.step_id, 'outcome', NEW.outcome,
                           'code', NEW.code, 'kind', NEW.kind, 'message', NEW.message,
                           'count', NEW.count, 'reopened', TG_OP = 'UPDATE'));
    RETURN NULL;
END $$;
CREATE TRIGGER notify_failure_group_new AFTER INSERT ON failure_groups FOR EACH ROW
    EXECUTE FUNCTION notify_failure_group_opened();
CREATE TRIGGER notify_failure_group_reopened AFTER UPDATE OF opened_xact ON failure_groups
    FOR EACH ROW WHEN (OLD.opened_xact IS DISTINCT FROM NEW.opened_xact)
    EXECUTE FUNCTION notify_failure_group_opened();
ALTER TABLE failure_groups DISABLE TRIGGER notify_failure_group_new;
ALTER TABLE failure_groups DISABLE TRIGGER notify_failure_group_reopened;
COMMIT;
