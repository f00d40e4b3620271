-- Security round 4: a source's delivery identity (docs/reference/security.md, identity
-- spaces).
--
-- source_deliveries records, per source and delivery id, the body's digest and the
-- routing the delivery got (`routed`: its subscriptions and executions, [] when nothing
-- matched). A redelivery answers that routing whatever its headers say now, so an unsigned
-- header cannot re-route a captured signed delivery; another body under a known id is 409.
-- Rows are forgotten with the idempotency keys (FLOWFORGE_IDEMPOTENCY_KEY_HOURS,
-- worker/housekeeping.py) through source_deliveries_by_age.
--
-- The per-workflow keys a source makes (`source:<name>:<delivery id>`) move to the system
-- key space (idempotency_keys.origin, migration 0017): existing ones an archived delivery
-- shows came through a source; the others expire with their key lifetime.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0039_source_deliveries');
CREATE TABLE source_deliveries (
    source_id   bigint NOT NULL,
    identity    text NOT NULL,
    body_sha256 bytea NOT NULL,
    routed      jsonb NOT NULL DEFAULT '[]',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_id, identity)
);
CREATE INDEX source_deliveries_by_age ON source_deliveries (created_at);
UPDATE idempotency_keys k SET origin = 'system'
WHERE k.origin = 'client' AND k.key LIKE 'source:%'
  AND EXISTS (SELECT 1 FROM webhook_deliveries d
              WHERE d.execution_id = k.execution_id AND d.source_id IS NOT NULL)
  AND NOT EXISTS (SELECT 1 FROM idempotency_keys s
                  WHERE s.workflow_id = k.workflow_id AND s.origin = 'system' AND s.key = k.key);
COMMIT;
