-- Notifications, part two (docs/contract.md#notifications).
--
-- 1. An endpoint's secret is stored sealed (AES-256-GCM, flowforge/trust/sealing.py) under
--    FLOWFORGE_NOTIFY_KEY, which the API, the worker (it signs and sends) and bin/migrate
--    hold: a standard endpoint's whsec_ signing secret, a Slack endpoint's webhook URL
--    (whose `url` then shows only its scheme and host). SQL cannot know the key: rows
--    written before this migration keep their clear values, which the worker still uses,
--    until bin/migrate (run with the key) seals them (store/notifications.seal_clear).
-- 2. Event kind queue.full: an intake refused because its workflow already has
--    concurrency.max_queued queued executions records one event per crossing. The alarm
--    row below remembers the crossing; the notifier deletes it (re-arms) once that queue
--    holds fewer than half its bound.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0067_notify_sealed_queue_full');

ALTER TABLE notify_endpoints ADD COLUMN sealed bytea;
COMMENT ON COLUMN notify_endpoints.secret IS 'legacy clear value; emptied by bin/migrate';
COMMENT ON COLUMN notify_endpoints.sealed IS
    'version byte, 12-byte nonce, AES-256-GCM ciphertext+tag of the whsec_ secret (standard) '
    'or the URL (slack); AAD names the row';

CREATE TABLE notify_queue_alarms (
    workflow_id bigint PRIMARY KEY REFERENCES workflows (id) ON DELETE CASCADE,
    bound       integer NOT NULL,
    at          timestamptz NOT NULL DEFAULT now()
);

-- Called by an intake refused for max_queued (store/flowcontrol.py), folded into the
-- statement that path runs anyway: records queue.full once per crossing, and only while an
-- enabled endpoint subscribes to it. Returns whether it recorded.
CREATE FUNCTION notify_queue_full(p_workflow bigint, p_bound integer)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM notify_endpoints
                   WHERE disabled_at IS NULL AND 'queue.full' = ANY (kinds)
                     AND (workflow_id IS NULL OR workflow_id = p_workflow)) THEN
        RETURN false;
    END IF;
    INSERT INTO notify_queue_alarms (workflow_id, bound) VALUES (p_workflow, p_bound)
    ON CONFLICT (workflow_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM notify_record('queue.full', p_workflow, NULL,
                          jsonb_build_object('max_queued', p_bound));
    RETURN true;
END $$;
COMMIT;
