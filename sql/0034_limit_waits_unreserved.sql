-- Reserved places in a rate limit's schedule are woken by the worker that recorded them,
-- in-process (flowforge/worker/places.py); the timer scanner computes its next pass from
-- the other waits only (outbound.NEXT_LIMITED), found through this index without reading
-- past every reserved place of a long throttled backlog.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0034_limit_waits_unreserved');
CREATE INDEX limit_waits_unreserved ON limit_waits (wake_at) WHERE NOT woken AND NOT reserved;
COMMIT;
