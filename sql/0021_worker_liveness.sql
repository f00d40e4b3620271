-- Worker liveness (issue 26): each bin/worker upserts its row every couple of seconds; the
-- reaper of any worker takes a row silent for longer than model.WORKER_DEAD_AFTER_S as
-- a dead worker and expires its leases at once, so its running steps are recovered in
-- seconds instead of a whole lease (60 s by default), while a live worker keeps the
-- long lease a slow request needs. A worker that stops cleanly deletes its own row.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0021_worker_liveness');
CREATE TABLE worker_heartbeats (
    worker_id text PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    beat_at timestamptz NOT NULL DEFAULT now()
);
COMMIT;
