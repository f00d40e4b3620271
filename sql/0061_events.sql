-- Events correlated by a business key (docs/contract.md#events).
--
-- `events`: one row per event received, by `POST /api/v1/events` (sender 'api') or emitted
-- by a workflow's verified delivery (sender 'workflow:<key>'). Its identity is its delivery
-- id within its sender and name: a redelivery finds the row (UNIQUE) and changes nothing.
-- `audience` is the workflow keys whose waits may take it (the sending API key's scope;
-- NULL: every workflow). It is kept until `expires_at` (FLOWFORGE_EVENT_LOOKBACK_S after it
-- arrived) for waits that open later; the housekeeping deletes it then. `fanned_out_at` is
-- set once every wait open at its arrival was offered it (a redelivery finishes a fan-out
-- a crash cut short).
--
-- `event_waits`: a wait step waiting for an event (one row per step; a retry's new round
-- replaces it), found by name and key by the event's sender, deleted when the step takes
-- the event or is found no longer open. `event_consumptions`: which steps took which event,
-- written in the unit of work that makes the step succeed; the primary key is the rule
-- "each event at most once per step".
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0061_events');
CREATE TABLE events (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    sender        text NOT NULL,
    name          text NOT NULL,
    key           text NOT NULL,
    delivery_id   text NOT NULL,
    payload       jsonb NOT NULL,
    body_sha256   bytea NOT NULL,
    audience      text[],
    received_at   timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    fanned_out_at timestamptz,
    UNIQUE (sender, name, delivery_id)
);
CREATE INDEX events_by_key ON events (name, key, received_at);
CREATE INDEX events_expiry ON events (expires_at);

CREATE TABLE event_waits (
    execution_id uuid NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    step_id      text NOT NULL,
    workflow     text NOT NULL,
    sender       text NOT NULL,
    name         text NOT NULL,
    key          text NOT NULL,
    opened_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, step_id)
);
CREATE INDEX event_waits_by_key ON event_waits (name, key);

CREATE TABLE event_consumptions (
    event_id     uuid NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    execution_id uuid NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    step_id      text NOT NULL,
    consumed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, execution_id, step_id)
);
CREATE INDEX event_consumptions_by_step ON event_consumptions (execution_id, step_id);
COMMIT;
