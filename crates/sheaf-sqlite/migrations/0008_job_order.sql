-- Per-key ordering: a job with an order key is claimable only while it is the first of its
-- (destination, order key) in the queue. `order_seq` numbers a key's jobs in the order the
-- single writer inserted them (one more than the key's highest), and the partial index finds a
-- key's earlier jobs for the claim and the insert without touching unordered rows, which leave
-- both columns NULL and cost nothing.
ALTER TABLE jobs ADD COLUMN order_key TEXT;
ALTER TABLE jobs ADD COLUMN order_seq INTEGER;
ALTER TABLE dead_letters ADD COLUMN order_key TEXT;

CREATE INDEX jobs_by_order ON jobs (destination_id, order_key, order_seq)
    WHERE order_key IS NOT NULL;
