-- The delivery queue (seed 002, BRIEF "JobQueue").
--
-- Job rows are minimal: ids, attempt number, carried attempt time, due time and lease; never a
-- payload. fillfactor = 85 leaves room on each page for the new row version a claim or a renewal
-- writes, and `claimed_until` is in no index (nor in an index predicate), so those updates are
-- HOT: no index entry is written, and the old version can be pruned by the next reader of the
-- page instead of waiting for vacuum. `next_due_at` is indexed; moving it (a reschedule) is not
-- HOT, and a completion deletes the row.
--
-- The table churns (every job is inserted and deleted), so autovacuum runs on it at 2 % dead or
-- inserted rows instead of the default 20 %: seed 002 tunes it "relatively strict" for the same
-- reason, and the table is small, so each run is cheap.

CREATE TABLE jobs (
    id                uuid             PRIMARY KEY,
    tenant_id         text COLLATE "C" NOT NULL,
    event_id          text COLLATE "C" NOT NULL,
    destination_id    uuid             NOT NULL,
    attempt_number    bigint           NOT NULL,
    last_attempt_time timestamptz,
    next_due_at       timestamptz      NOT NULL,
    claimed_until     timestamptz
) WITH (
    fillfactor = 85,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- The claim reads due jobs in (next_due_at, id) order. No index on tenant_id: purge_tenant is
-- rare and scans the (small) table, while every enqueue would pay for the index.
CREATE INDEX jobs_due ON jobs (next_due_at, id);

-- Dead letters live in their own table so they never occupy the queue's pages or its due index:
-- a destination that is gone for good adds one per event, and the queue table must stay small.
CREATE TABLE dead_letters (
    id                uuid             PRIMARY KEY,
    tenant_id         text COLLATE "C" NOT NULL,
    event_id          text COLLATE "C" NOT NULL,
    destination_id    uuid             NOT NULL,
    attempt_number    bigint           NOT NULL,
    last_attempt_time timestamptz,
    due_at            timestamptz      NOT NULL,
    reason            text             NOT NULL,
    dead_lettered_at  timestamptz      NOT NULL
);

CREATE INDEX dead_letters_by_tenant
    ON dead_letters (tenant_id, dead_lettered_at DESC, id DESC);
