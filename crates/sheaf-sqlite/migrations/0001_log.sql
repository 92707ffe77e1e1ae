-- The delivery log: events and attempts.
--
-- Times are INTEGER microseconds since the epoch; ids are TEXT, compared bytewise (SQLite's
-- default BINARY collation), and UUIDs their canonical lower-case text, whose order is the
-- bytes' order: listings break time ties by id the way every backend does.
--
-- The payload lives only in `events`, as JSON text; an attempt keeps its event's topic (small,
-- and filtered on) and reads the payload back through the events key. Both are rowid tables: a
-- ~2 KB payload in a WITHOUT ROWID table would spill out of the key's B-tree pages.

CREATE TABLE events (
    tenant_id   TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    topic       TEXT    NOT NULL,
    event_time  INTEGER NOT NULL,
    data        TEXT    NOT NULL,
    traceparent TEXT,
    tracestate  TEXT,
    UNIQUE (tenant_id, event_id)
);

-- list_events: a tenant's events newest first by (time, id), keyset cursor on the same columns.
CREATE INDEX events_by_tenant_time ON events (tenant_id, event_time DESC, event_id DESC);
-- list_events with a topic filter: topics can be rare, so they get their own ordered index.
CREATE INDEX events_by_tenant_topic_time
    ON events (tenant_id, topic, event_time DESC, event_id DESC);

CREATE TABLE attempts (
    tenant_id      TEXT    NOT NULL,
    attempt_id     TEXT    NOT NULL,
    event_id       TEXT    NOT NULL,
    destination_id TEXT    NOT NULL,
    number         INTEGER NOT NULL,
    attempt_time   INTEGER NOT NULL,
    status         TEXT    NOT NULL,
    trigger        TEXT    NOT NULL,
    response_code  INTEGER,
    duration_ms    INTEGER NOT NULL,
    response_body  TEXT,
    error          TEXT,
    event_topic    TEXT    NOT NULL,
    UNIQUE (tenant_id, attempt_id)
);

-- The latest-attempt lookup: one probe per key, reading the first entry at or after the key's
-- time bound; the id breaks time ties inside the index. It also serves list_attempts filtered
-- by event (and destination).
CREATE INDEX attempts_latest
    ON attempts (tenant_id, event_id, destination_id, attempt_time DESC, attempt_id DESC);
-- list_attempts: newest first, and per destination.
CREATE INDEX attempts_by_tenant_time ON attempts (tenant_id, attempt_time DESC, attempt_id DESC);
CREATE INDEX attempts_by_tenant_destination_time
    ON attempts (tenant_id, destination_id, attempt_time DESC, attempt_id DESC);
-- list_attempts with status = 'failed': failures are rare when all is well, which is exactly
-- when walking the newest-first index to find them would be slow.
CREATE INDEX attempts_failed_by_tenant_time
    ON attempts (tenant_id, attempt_time DESC, attempt_id DESC) WHERE status = 'failed';
