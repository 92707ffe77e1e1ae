-- The delivery log: events and attempts.
--
-- Every id column is COLLATE "C": ids compare bytewise in every backend (sheaf_store::ids), and
-- listings break time ties by id. UUID columns compare bytewise already.
--
-- An event's payload lives only in `events`; an attempt keeps its event's topic (small, and
-- filtered on) but reads the payload back through the events primary key. Attempts outnumber
-- events (destinations times retries), so one copy of each ~2 KB payload is the bulk of the
-- saving. The payload is `json`, not `jsonb`: it is written and read whole, never queried inside,
-- and `json` keeps any valid JSON (jsonb rejects the \u0000 escape, which would fail a whole
-- write batch for one odd event).

CREATE TABLE events (
    tenant_id  text COLLATE "C" NOT NULL,
    event_id   text COLLATE "C" NOT NULL,
    topic      text COLLATE "C" NOT NULL,
    event_time timestamptz      NOT NULL,
    data       json             NOT NULL,
    PRIMARY KEY (tenant_id, event_id)
);

-- list_events: a tenant's events newest first by (time, id), keyset cursor on the same columns.
CREATE INDEX events_by_tenant_time ON events (tenant_id, event_time DESC, event_id DESC);
-- list_events with a topic filter: topics can be rare, so they get their own ordered index.
CREATE INDEX events_by_tenant_topic_time
    ON events (tenant_id, topic, event_time DESC, event_id DESC);

CREATE TABLE attempts (
    tenant_id      text COLLATE "C" NOT NULL,
    attempt_id     uuid             NOT NULL,
    event_id       text COLLATE "C" NOT NULL,
    destination_id uuid             NOT NULL,
    number         bigint           NOT NULL,
    attempt_time   timestamptz      NOT NULL,
    status         text             NOT NULL,
    trigger        text             NOT NULL,
    response_code  integer,
    duration_ms    bigint           NOT NULL,
    response_body  text,
    error          text,
    event_topic    text COLLATE "C" NOT NULL,
    PRIMARY KEY (tenant_id, attempt_id)
);

-- latest_attempts (seed 000, BRIEF "LogStore::latest_attempts"): one probe per key, reading the
-- first entry at or after the key's time bound. The id breaks time ties inside the index, so the
-- probe stops at its first entry instead of sorting ties. It also serves list_attempts filtered
-- by event (and destination).
CREATE INDEX attempts_latest
    ON attempts (tenant_id, event_id, destination_id, attempt_time DESC, attempt_id DESC);
-- list_attempts: newest first, and per destination (the API's "attempts of this destination").
CREATE INDEX attempts_by_tenant_time ON attempts (tenant_id, attempt_time DESC, attempt_id DESC);
CREATE INDEX attempts_by_tenant_destination_time
    ON attempts (tenant_id, destination_id, attempt_time DESC, attempt_id DESC);
-- list_attempts with status = 'failed': failures are rare when all is well, which is exactly when
-- walking the newest-first index to find them would be slow; a partial index stays as small as
-- the failures are few. Successes (and topics) are filtered while walking the indexes above.
CREATE INDEX attempts_failed_by_tenant_time
    ON attempts (tenant_id, attempt_time DESC, attempt_id DESC) WHERE status = 'failed';
