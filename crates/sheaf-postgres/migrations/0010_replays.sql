-- Bulk replays (sheaf_store::ReplayStore): one row per replay, so any process sharing the
-- schema reads a replay's progress and another takes it over when its owner stops.
--
-- The owner writes the row once per page of the replay's source: its counters, the cursor of
-- the next page (`position`, the opaque form of sheaf_store::Cursor) and a renewed lease.
-- `lease_until` is on the server's clock, as the queue's `claimed_until` is; a row is free to
-- take over when it is running and `lease_until` is NULL (released) or past. `lease_until` is
-- in no index, so a page's write is a HOT update (fillfactor leaves room for it), the same
-- reason the queue keeps `claimed_until` out of its indexes. The takeover scans the running
-- rows through `replays_running` (few: a replay runs for seconds to minutes), and housekeeping
-- deletes finished rows by age through `replays_finished` (a day's worth of replays).
--
-- Counters are bigint: a replay's counts are u64 in Rust and stay far below 2^63.

CREATE TABLE replays (
    id                   uuid             PRIMARY KEY,
    tenant_id            text COLLATE "C" NOT NULL,
    request              jsonb            NOT NULL,
    state                text             NOT NULL
                             CHECK (state IN ('running', 'completed', 'failed')),
    pages                bigint           NOT NULL DEFAULT 0,
    jobs                 bigint           NOT NULL DEFAULT 0,
    dead_letters_removed bigint           NOT NULL DEFAULT 0,
    skipped              bigint           NOT NULL DEFAULT 0,
    limited              boolean          NOT NULL DEFAULT false,
    log_store_queries    bigint           NOT NULL DEFAULT 0,
    queue_queries        bigint           NOT NULL DEFAULT 0,
    position             text,
    error                text,
    started_at           timestamptz      NOT NULL,
    updated_at           timestamptz      NOT NULL,
    finished_at          timestamptz,
    owner                uuid,
    lease_until          timestamptz,
    takeovers            bigint           NOT NULL DEFAULT 0
) WITH (fillfactor = 80);

CREATE INDEX replays_running ON replays (started_at, id) WHERE state = 'running';

CREATE INDEX replays_finished ON replays (finished_at) WHERE finished_at IS NOT NULL;
