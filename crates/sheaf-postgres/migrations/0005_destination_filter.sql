-- A destination's payload filter: the JSON as the API accepted it (sheaf_store::Filter::source),
-- parsed again when the row is read. NULL: every event whose topic the destination receives.

ALTER TABLE destinations ADD COLUMN filter jsonb;
