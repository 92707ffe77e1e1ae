-- The publish outbox, used when the queue is in Postgres and the log store is elsewhere
-- (ClickHouse): a publish is durable once its event and its jobs commit here, and the log
-- shipper moves events and attempts on to the log store behind it (sheaf_store's `outbox`
-- module docs). When the log store is this schema's own `events` and `attempts`, those tables
-- are the outbox and these stay empty.

-- Idempotency: one row per accepted event key, kept for the idempotency window
-- (SHEAF_IDEMPOTENCY_WINDOW) after the payload has been shipped and its jobs are gone. The rows
-- arrive in time order, so a BRIN index on the time finds the expired ones for the pruning
-- without the write cost of a second B-tree.
CREATE TABLE accepted_events (
    tenant_id   text COLLATE "C" NOT NULL,
    event_id    text COLLATE "C" NOT NULL,
    accepted_at timestamptz      NOT NULL,
    PRIMARY KEY (tenant_id, event_id)
);
CREATE INDEX accepted_events_by_time ON accepted_events USING brin (accepted_at);

-- Events waiting for the log store. `seq` is the shipping order; the key index serves first
-- deliveries in a process that did not take the publish (their payload is read here, not from
-- the log store, while it waits). Every row is inserted once and deleted once, so the tables
-- are vacuumed as eagerly as the jobs table.
CREATE TABLE outbox_events (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id  text COLLATE "C" NOT NULL,
    event_id   text COLLATE "C" NOT NULL,
    topic      text COLLATE "C" NOT NULL,
    event_time timestamptz      NOT NULL,
    data       json             NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);
CREATE INDEX outbox_events_by_key ON outbox_events (tenant_id, event_id);

-- Attempts waiting for the log store, committed with their job's outcome. An attempt keeps no
-- copy of its event's payload (it would double the WAL a delivery writes): the shipper puts the
-- payload back from the events it ships with it, its process's memory or the log store, which
-- wants it in the attempt row.
CREATE TABLE outbox_attempts (
    seq            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
    event_topic    text COLLATE "C" NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);
