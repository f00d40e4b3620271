-- Schedules (SPEC §9).
--
-- One row per workflow whose newest version has `trigger.schedule`, re-derived by the
-- publish transaction. `next_tick_at` is the next tick instant not yet decided: every
-- tick before it has its ledger row. Workers claim due rows FOR UPDATE SKIP LOCKED, so a
-- tick is decided by one worker; the tick's execution is claimed by its idempotency key
-- `schedule:<instant>` in the intake statement besides.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0011_schedules');
CREATE TABLE schedules (
    workflow_id   bigint PRIMARY KEY REFERENCES workflows (id),
    -- The version whose schedule this row follows (the newest that has one).
    version_id    bigint NOT NULL REFERENCES workflow_versions (id),
    -- The schedule object as published; NULL once a newer version has none.
    spec          jsonb,
    -- The next tick instant to decide, and when it fires (the tick plus its jitter).
    -- NULL: no tick will come (no schedule, or an expression that fires no more).
    next_tick_at  timestamptz,
    fire_at       timestamptz,
    paused_at     timestamptz,
    paused_by     jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
-- The scheduler's claim: due rows in fire order.
CREATE INDEX schedules_due ON schedules (fire_at) WHERE fire_at IS NOT NULL;

-- The ledger: what became of each due tick (fired, skipped, buffered, missed, paused), and
-- the operator's pause and resume. Bounded: the
-- scheduler keeps the newest rows of each schedule (flowforge/schedules.py, LEDGER_KEEP).
-- No foreign keys: it is written at the rate ticks fire (see 0002).
CREATE TABLE schedule_ticks (
    id            bigserial PRIMARY KEY,
    workflow_id   bigint NOT NULL,
    tick_at       timestamptz NOT NULL,
    outcome       text NOT NULL
        CHECK (outcome IN ('fired', 'skipped', 'buffered', 'missed', 'paused',
                           'pause', 'resume')),
    execution_id  uuid,
    reason        text,
    -- Who asked, for operator actions (trigger, backfill, pause, resume): the API key.
    actor         jsonb,
    -- Seconds from the tick's fire time to the decision (the execution created).
    lag_s         double precision,
    created_at    timestamptz NOT NULL DEFAULT now()
);
-- The ledger of one schedule, newest first (the API's last 100; the trim).
CREATE INDEX schedule_ticks_recent ON schedule_ticks (workflow_id, id DESC);
-- Whether a tick instant already fired (backfill and trigger never fire one twice).
CREATE INDEX schedule_ticks_by_instant ON schedule_ticks (workflow_id, tick_at)
    WHERE outcome IN ('fired', 'buffered');
COMMIT;
