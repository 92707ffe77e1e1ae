-- A dead letter may hold its order key (the destination blocks a key on a dead letter): its job
-- row then stays in `jobs`, parked at the end of time (`next_due_at` = the largest integer,
-- past every claim's bound), so that the claim's probe for a key's earlier jobs still finds it
-- and the key's later jobs wait. `holds_key` marks such a dead letter; removing it deletes the
-- parked row, requeueing it moves the row back to now.

ALTER TABLE dead_letters ADD COLUMN holds_key INTEGER NOT NULL DEFAULT 0;

-- The destination's choice (sheaf_store::Destination::dead_letter_blocks_key).
ALTER TABLE destinations ADD COLUMN dead_letter_blocks_key INTEGER NOT NULL DEFAULT 0;
