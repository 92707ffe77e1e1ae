-- The delivery queue: minimal job rows (ids, attempt number, carried attempt time, due time,
-- lease), never a payload.
--
-- `claimed_until` is the lease, on the process's clock as microseconds; it is in no index, so a
-- claim, a renewal or a release rewrites only the row. `next_due_at` is indexed with the id: the
-- claim reads due jobs in (next_due_at, id) order from the front of that index. A completion
-- deletes the row. SQLite has one writer, so claims are simply transactions on it: no two can
-- interleave, and no `SKIP LOCKED` is needed.

CREATE TABLE jobs (
    id                TEXT    PRIMARY KEY,
    tenant_id         TEXT    NOT NULL,
    event_id          TEXT    NOT NULL,
    destination_id    TEXT    NOT NULL,
    attempt_number    INTEGER NOT NULL,
    last_attempt_time INTEGER,
    next_due_at       INTEGER NOT NULL,
    claimed_until     INTEGER
);

CREATE INDEX jobs_due ON jobs (next_due_at, id);

-- Dead letters live in their own table so they never occupy the queue's pages or its due index.
CREATE TABLE dead_letters (
    id                TEXT    PRIMARY KEY,
    tenant_id         TEXT    NOT NULL,
    event_id          TEXT    NOT NULL,
    destination_id    TEXT    NOT NULL,
    attempt_number    INTEGER NOT NULL,
    last_attempt_time INTEGER,
    due_at            INTEGER NOT NULL,
    reason            TEXT    NOT NULL,
    dead_lettered_at  INTEGER NOT NULL
);

CREATE INDEX dead_letters_by_tenant ON dead_letters (tenant_id, dead_lettered_at DESC, id DESC);

-- The processes sharing the queue, for JobQueue::heartbeat: several processes may open the same
-- file (they take turns writing), and limits shared by all of them are split by this count.
CREATE TABLE processes (
    id      TEXT    PRIMARY KEY,
    seen_at INTEGER NOT NULL
);
