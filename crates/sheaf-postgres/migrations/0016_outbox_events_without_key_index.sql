-- An accepted event's payload waiting in `outbox_events` is found through its key's row in
-- `accepted_events`, which now holds the payload row's `seq`, instead of through a second index
-- on `outbox_events`. A publish writes both rows in one statement anyway (the key row first, to
-- decide idempotency), so the pointer costs eight bytes and one draw from the sequence, and the
-- index it replaces was a B-tree insert per accepted event, for a read that only a first
-- delivery in another process than the accepting one makes (the accepting process has the
-- payload in memory). `seq` stays NULL on keys whose payload was shipped before this migration.
ALTER TABLE accepted_events ADD COLUMN seq bigint;

UPDATE accepted_events AS a
SET seq = o.seq
FROM outbox_events AS o
WHERE o.tenant_id = a.tenant_id AND o.event_id = a.event_id;

DROP INDEX outbox_events_by_key;
