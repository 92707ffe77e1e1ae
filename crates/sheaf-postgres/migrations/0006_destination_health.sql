-- A destination's health: why it is disabled (sheaf_store::DisabledReason) and its consecutive
-- failed attempts, as EntityStore::record_delivery_health counts them.
--
-- The reason is three plain columns rather than one jsonb value: `since` stays a timestamptz
-- (microseconds, compared and read like every other time here), and the CHECK keeps the three
-- all set or all NULL, so a reason is never half there. NULL: no reason (an enabled
-- destination, or one disabled before this migration or by a patch that gave none).
--
-- The count is an integer (a u32 on the Rust side) that saturates at 2^31 - 1, and a limit above
-- that counts as 2^31 - 1: a destination is disabled when it reaches its limit and is sent nothing
-- afterwards, so its count barely passes the limit, and only an absurd limit comes near the bound. Adding the columns
-- rewrites no rows: their defaults are constants.

ALTER TABLE destinations
    ADD COLUMN disabled_reason        text,
    ADD COLUMN disabled_since         timestamptz,
    ADD COLUMN disabled_automatically boolean,
    ADD COLUMN consecutive_failures   integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    ADD CHECK ((disabled_reason IS NULL) = (disabled_since IS NULL)
               AND (disabled_reason IS NULL) = (disabled_automatically IS NULL));
