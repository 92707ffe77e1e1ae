-- A destination's per-key ordering (sheaf_store::Destination::ordering_key): the JSON pointer
-- into each event whose value is its order key, NULL for no ordering. The service checks it.

ALTER TABLE destinations ADD COLUMN ordering_key text;
