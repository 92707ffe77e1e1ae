-- Per-key ordering (sheaf_store's `Job::order_key`): a job with an order key is claimable only
-- while no job of its (destination, order key) with a lower `order_seq` is queued. Jobs of a key
-- are numbered when inserted, one past the key's highest, under a transaction-level advisory
-- lock on the key taken before the inserting statement starts: so the numbering follows the
-- order in which the inserting transactions commit. Unordered jobs leave both columns NULL, and
-- the partial index holds ordered rows only: the claim probes it for ordered rows alone.
-- Neither column ever changes, so a claim's or a renewal's update stays HOT.
ALTER TABLE jobs ADD COLUMN order_key text COLLATE "C";
ALTER TABLE jobs ADD COLUMN order_seq bigint;
ALTER TABLE dead_letters ADD COLUMN order_key text COLLATE "C";

CREATE INDEX jobs_by_order ON jobs (destination_id, order_key, order_seq)
    WHERE order_key IS NOT NULL;
