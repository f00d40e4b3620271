-- Outbound limits belong to their owner (docs/reference/security.md, "Who owns a limit"):
-- a limit's row, its slots and its waits are keyed by (owner, key), where `owner` is the
-- workflow's id for a definition's limit, 'host' for an operator's per-host limit
-- (FLOWFORGE_OUTBOUND_LIMITS) and 'shared' for a limit the operator shares between named
-- workflows (FLOWFORGE_SHARED_LIMITS). A rendered limit name only ever fills `key`: no
-- sender's data can reach another workflow's limits or the operator's.
--
-- Rows from before: an operator's "host:NAME" becomes ('host', NAME). A definition's
-- limit row was shared by every workflow that rendered the same name; it is copied to
-- each workflow that has a step waiting for it or in flight through it (its tat, hold
-- and circuit carry on for them) and dropped otherwise (the first request after the
-- upgrade finds a fresh row: at most one burst more than the limit, once).
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0036_limit_owners');

ALTER TABLE limit_waits ADD COLUMN owner text;
UPDATE limit_waits SET owner = 'host', key = substr(key, 6) WHERE key LIKE 'host:%';
UPDATE limit_waits w SET owner = e.workflow_id::text
FROM executions e WHERE w.owner IS NULL AND e.id = w.execution_id;
DELETE FROM limit_waits WHERE owner IS NULL;
ALTER TABLE limit_waits ALTER COLUMN owner SET NOT NULL;
DROP INDEX limit_waits_key;
CREATE INDEX limit_waits_key ON limit_waits (owner, key, wake_at) WHERE NOT woken;

ALTER TABLE outbound_slots ADD COLUMN owner text;
UPDATE outbound_slots SET owner = 'host', key = substr(key, 6) WHERE key LIKE 'host:%';
UPDATE outbound_slots s SET owner = e.workflow_id::text
FROM executions e WHERE s.owner IS NULL AND e.id = s.execution_id;
DELETE FROM outbound_slots WHERE owner IS NULL;
ALTER TABLE outbound_slots ALTER COLUMN owner SET NOT NULL;
ALTER TABLE outbound_slots DROP CONSTRAINT outbound_slots_pkey;
ALTER TABLE outbound_slots ADD PRIMARY KEY (execution_id, step_id, owner, key);
DROP INDEX outbound_slots_key;
CREATE INDEX outbound_slots_key ON outbound_slots (owner, key, until);

ALTER TABLE outbound_limits ADD COLUMN owner text;
ALTER TABLE outbound_limits DROP CONSTRAINT outbound_limits_pkey;
UPDATE outbound_limits SET owner = 'host', key = substr(key, 6) WHERE key LIKE 'host:%';
INSERT INTO outbound_limits
    (owner, key, tat, sent_tat, held_until, held_reason, circuit, failures,
     first_failure_at, opened_until, probe, updated_at)
SELECT u.owner, l.key, l.tat, l.sent_tat, l.held_until, l.held_reason, l.circuit,
       l.failures, l.first_failure_at, l.opened_until, l.probe, l.updated_at
FROM outbound_limits l
JOIN (SELECT owner, key FROM limit_waits UNION SELECT owner, key FROM outbound_slots) u
  ON u.key = l.key AND u.owner <> 'host'
WHERE l.owner IS NULL;
DELETE FROM outbound_limits WHERE owner IS NULL;
ALTER TABLE outbound_limits ALTER COLUMN owner SET NOT NULL;
ALTER TABLE outbound_limits ADD PRIMARY KEY (owner, key);
ALTER TABLE outbound_limits ADD CONSTRAINT outbound_limits_owner
    CHECK (owner IN ('host', 'shared') OR owner ~ '^[1-9][0-9]*$');
DROP INDEX outbound_limits_circuits;
CREATE INDEX outbound_limits_circuits ON outbound_limits (owner, key) WHERE circuit <> 'closed';
-- For operators: the holds in force (GET /api/v1/circuits lists them with the circuits).
CREATE INDEX outbound_limits_held ON outbound_limits (held_until) WHERE held_until IS NOT NULL;
COMMIT;
