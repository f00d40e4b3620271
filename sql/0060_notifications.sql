-- Operational notifications (docs/contract.md#notifications): endpoints subscribed to event
-- kinds, the events waiting to be coalesced into a message, and the messages (deliveries)
-- with their attempts. An event is recorded by a trigger in the transaction of the state
-- change it reports, so nothing is lost and no execution waits on a receiver: the worker's
-- notifier thread turns pending events into deliveries and sends them. The triggers are
-- created DISABLED: store/notifications.py enables them while at least one endpoint is
-- enabled, so a deployment without subscriptions runs no trigger at all.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0060_notifications');

CREATE TABLE notify_endpoints (
    id              bigserial PRIMARY KEY,
    name            text NOT NULL UNIQUE,
    url             text NOT NULL,
    shape           text NOT NULL CHECK (shape IN ('standard', 'slack')),
    -- whsec_ secret of the Standard Webhooks signature (NULL for the slack shape); the
    -- worker signs with it, and the worker holds no FLOWFORGE_ENCRYPTION_KEY.
    secret          text,
    kinds           text[] NOT NULL,
    workflow_id     bigint REFERENCES workflows (id) ON DELETE CASCADE,
    created_at      timestamptz NOT NULL DEFAULT now(),
    disabled_at     timestamptz,
    disabled_reason text,
    failing_since   timestamptz,
    last_batch_at   timestamptz
);

CREATE TABLE notify_pending (
    id           bigserial PRIMARY KEY,
    endpoint_id  bigint NOT NULL REFERENCES notify_endpoints (id) ON DELETE CASCADE,
    kind         text NOT NULL,
    workflow_id  bigint,
    execution_id uuid,
    detail       jsonb NOT NULL DEFAULT '{}',
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notify_pending_by_endpoint ON notify_pending (endpoint_id, id);

CREATE TABLE notify_deliveries (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint_id  bigint NOT NULL REFERENCES notify_endpoints (id) ON DELETE CASCADE,
    payload      jsonb NOT NULL,
    events       integer NOT NULL,
    status       text NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts     integer NOT NULL DEFAULT 0,
    next_at      timestamptz NOT NULL DEFAULT now(),
    last_status  integer,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz
);
CREATE INDEX notify_deliveries_due ON notify_deliveries (next_at) WHERE status = 'pending';
CREATE INDEX notify_deliveries_by_endpoint ON notify_deliveries (endpoint_id, created_at DESC);
-- What the notifier forgets after HISTORY_DAYS (store/notifications.FORGET).
CREATE INDEX notify_deliveries_finished ON notify_deliveries (created_at) WHERE status <> 'pending';

-- One event for every enabled endpoint subscribed to its kind (and its workflow, if any).
CREATE FUNCTION notify_record(p_kind text, p_workflow bigint, p_execution uuid, p_detail jsonb)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO notify_pending (endpoint_id, kind, workflow_id, execution_id, detail)
    SELECT id, p_kind, p_workflow, p_execution, p_detail FROM notify_endpoints
    WHERE disabled_at IS NULL AND p_kind = ANY (kinds)
      AND (workflow_id IS NULL OR workflow_id = p_workflow)
$$;

CREATE FUNCTION notify_execution_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM notify_record(
        CASE WHEN NEW.status = 'failed' THEN 'execution.failed' ELSE 'execution.paused' END,
        NEW.workflow_id, NEW.id,
        jsonb_build_object('status', NEW.status, 'stop_reason', NEW.stop_reason));
    RETURN NULL;
END $$;
CREATE TRIGGER notify_execution AFTER UPDATE OF status ON executions FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND (NEW.status = 'failed' OR (NEW.status = 'paused' AND NEW.pause_reason = 'exhausted')))
    EXECUTE FUNCTION notify_execution_changed();

CREATE FUNCTION notify_step_unknown() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM notify_record('outcome.unknown',
        (SELECT workflow_id FROM executions WHERE id = NEW.execution_id), NEW.execution_id,
        jsonb_build_object('step', NEW.step_id));
    RETURN NULL;
END $$;
CREATE TRIGGER notify_step AFTER UPDATE OF status ON steps FOR EACH ROW
    WHEN (NEW.status = 'unknown' AND OLD.status IS DISTINCT FROM 'unknown')
    EXECUTE FUNCTION notify_step_unknown();

CREATE FUNCTION notify_circuit_opened() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM notify_record('circuit.opened',
        CASE WHEN NEW.owner ~ '^[0-9]+$' THEN NEW.owner::bigint END, NULL,
        jsonb_build_object('owner', NEW.owner, 'key', NEW.key));
    RETURN NULL;
END $$;
CREATE TRIGGER notify_circuit AFTER UPDATE OF circuit ON outbound_limits FOR EACH ROW
    WHEN (NEW.circuit = 'open' AND OLD.circuit IS DISTINCT FROM 'open')
    EXECUTE FUNCTION notify_circuit_opened();

ALTER TABLE executions DISABLE TRIGGER notify_execution;
ALTER TABLE steps DISABLE TRIGGER notify_step;
ALTER TABLE outbound_limits DISABLE TRIGGER notify_circuit;
COMMIT;
