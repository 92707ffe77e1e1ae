-- A destination's rate limit (sheaf_store::RateLimit): at most this many deliveries started per
-- second, across every process. NULL: no limit. The CHECK repeats RateLimit::new's bounds, so a
-- row another tool wrote cannot hold a limit the service would refuse to read. Adding a column
-- without a default rewrites no rows.
--
-- The processes sharing the queue, for JobQueue::heartbeat: each one upserts its row with the
-- server's now() and counts the rows seen within the heartbeat's ttl, which is how a limit shared
-- by every process is split between them. Rows are keyed by a process id the service draws at
-- start; a heartbeat deletes rows older than its ttl, so processes that died do not pile up, and
-- the table stays as small as the number of live processes.

ALTER TABLE destinations
    ADD COLUMN rate_limit_per_second integer
        CHECK (rate_limit_per_second BETWEEN 1 AND 10000);

CREATE TABLE processes (
    id      uuid        PRIMARY KEY,
    seen_at timestamptz NOT NULL
);
