-- The W3C trace context of the webhook that made an execution (flowforge/tracing.py): the
-- intake span's traceparent, parent of the execution's span. Every process that later
-- writes a span of this execution (a step's end, an attempt, after any crash or a delay
-- of days) reads it with the execution row it locks anyway, so the whole execution is one
-- trace with the partner's request. NULL when tracing was off at intake or the execution
-- did not come from a webhook: its trace is then rooted at the execution itself.
BEGIN;
INSERT INTO schema_migrations (version) VALUES ('0023_execution_trace_context');
ALTER TABLE executions ADD COLUMN traceparent text
    CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
COMMIT;
