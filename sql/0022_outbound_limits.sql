-- Outbound limits shared by every worker (SPEC §13, flowforge/outbound.py).
--
-- outbound_limits: one row per limit key (a definition's limit, rendered; or "host:NAME"
-- for an operator's per-host limit). `tat` is the generic cell rate algorithm's
-- theoretical arrival time: a request may leave at max(now, tat - (burst-1)/rate), and
-- each one moves tat on by 1/rate; `sent_tat` is the same over the instants requests were
-- admitted, so that late wake-ups never leave together. `held_until` is set by a 429/503 with Retry-After.
-- outbound_slots: the requests of a key in flight, for its `concurrency`; a slot ends at
-- the checkpoint, or by itself at `until` (the attempt's timeout plus the lease) when its
-- worker died. limit_waits: ready steps that wait for a key, and when to wake them.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0022_outbound_limits');

CREATE TABLE outbound_limits (
    key         text PRIMARY KEY,
    tat         timestamptz NOT NULL DEFAULT now(),
    sent_tat    timestamptz NOT NULL DEFAULT now(),
    held_until  timestamptz,
    held_reason text,
    -- The circuit breaker: `failures` in a row since `first_failure_at`; open until
    -- `opened_until`; half_open while `probe` (execution_id/step_id) is out, until
    -- `opened_until` at the latest (a probe whose worker died lets another go).
    circuit          text NOT NULL DEFAULT 'closed'
                     CHECK (circuit IN ('closed', 'open', 'half_open')),
    failures         integer NOT NULL DEFAULT 0,
    first_failure_at timestamptz,
    opened_until     timestamptz,
    probe            text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbound_limits_circuits ON outbound_limits (key) WHERE circuit <> 'closed';

CREATE TABLE outbound_slots (
    execution_id uuid NOT NULL,
    step_id      text NOT NULL,
    key          text NOT NULL,
    until        timestamptz NOT NULL,
    PRIMARY KEY (execution_id, step_id, key)
);
CREATE INDEX outbound_slots_key ON outbound_slots (key, until);

CREATE TABLE limit_waits (
    execution_id uuid NOT NULL,
    step_id      text NOT NULL,
    key          text NOT NULL,
    reason       text NOT NULL CHECK (reason IN ('rate', 'concurrency', 'held', 'circuit')),
    wake_at      timestamptz NOT NULL,
    -- A rate wait holds its place: the step leaves at wake_at without asking again.
    reserved     boolean NOT NULL DEFAULT false,
    woken        boolean NOT NULL DEFAULT false,
    since        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, step_id)
);
CREATE INDEX limit_waits_due ON limit_waits (wake_at) WHERE NOT woken;
CREATE INDEX limit_waits_key ON limit_waits (key, wake_at) WHERE NOT woken;
COMMIT;
