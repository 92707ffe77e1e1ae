-- Bulk replays (sheaf_store::ReplayStore): one row per replay, written once per page of its
-- source under a lease on the process's clock, taken over like a queue claim when the lease
-- runs out. Counters are INTEGER (u64 in Rust, far below 2^63).

CREATE TABLE replays (
    id                   TEXT    PRIMARY KEY,
    tenant_id            TEXT    NOT NULL,
    request              TEXT    NOT NULL,
    state                TEXT    NOT NULL CHECK (state IN ('running', 'completed', 'failed')),
    pages                INTEGER NOT NULL DEFAULT 0,
    jobs                 INTEGER NOT NULL DEFAULT 0,
    dead_letters_removed INTEGER NOT NULL DEFAULT 0,
    skipped              INTEGER NOT NULL DEFAULT 0,
    limited              INTEGER NOT NULL DEFAULT 0,
    log_store_queries    INTEGER NOT NULL DEFAULT 0,
    queue_queries        INTEGER NOT NULL DEFAULT 0,
    position             TEXT,
    error                TEXT,
    started_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    finished_at          INTEGER,
    owner                TEXT,
    lease_until          INTEGER,
    takeovers            INTEGER NOT NULL DEFAULT 0
);

-- The takeover scans the running rows oldest first; housekeeping deletes finished rows by age.
CREATE INDEX replays_running ON replays (started_at, id) WHERE state = 'running';
CREATE INDEX replays_finished ON replays (finished_at) WHERE finished_at IS NOT NULL;
