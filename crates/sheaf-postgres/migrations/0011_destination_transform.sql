-- A destination's transformation (sheaf_store::Destination::transform): the source of a jq
-- program that reshapes each event for it, NULL for none. The service checks it compiles.

ALTER TABLE destinations ADD COLUMN transform text;
