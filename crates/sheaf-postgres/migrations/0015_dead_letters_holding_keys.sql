-- A dead letter may hold its order key (the destination blocks a key on a dead letter): its job
-- row then stays in `jobs`, parked at `next_due_at = 'infinity'`, where no claim reaches it (the
-- claim walks `jobs_due` from its oldest entry and stops at now) while the claim's probe of
-- `jobs_by_order` for a key's earlier jobs still finds it, so the key's later jobs wait.
-- `holds_key` marks such a dead letter; removing it deletes the parked row, requeueing it moves
-- the row back to now, in its place.
ALTER TABLE dead_letters ADD COLUMN holds_key boolean NOT NULL DEFAULT false;

-- The destination's choice (sheaf_store::Destination::dead_letter_blocks_key).
ALTER TABLE destinations ADD COLUMN dead_letter_blocks_key boolean NOT NULL DEFAULT false;
