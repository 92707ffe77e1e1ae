-- Destinations of any type (sheaf_store::Destination::config): the type's own settings as one
-- JSON object, instead of the webhook URL alone. Existing rows are webhooks, so their URL
-- becomes {"url": …}. The store keeps config as given; the service's destination types check it.

ALTER TABLE destinations ADD COLUMN config jsonb;
UPDATE destinations SET config = jsonb_build_object('url', url);
ALTER TABLE destinations ALTER COLUMN config SET NOT NULL;
ALTER TABLE destinations DROP COLUMN url;
