-- The trace context of the publish that made an event (sheaf_store::TraceContext): its W3C
-- `traceparent` and, when it has one, its `tracestate`, both NULL for an untraced publish. A
-- delivery in any process, or after a restart, joins the publish's trace through them. Attempts
-- read them through their event, as they read its payload, so only the event tables get them.
-- Nullable columns without a default: adding them rewrites no row.

ALTER TABLE events ADD COLUMN traceparent text, ADD COLUMN tracestate text;
ALTER TABLE outbox_events ADD COLUMN traceparent text, ADD COLUMN tracestate text;
