-- Tenants and destinations. Secrets are stored as given (the service may seal them first).
--
-- JSON values (metadata, config, topics, headers, the payload filter) are TEXT written and read
-- whole by the store; nothing queries inside them.

CREATE TABLE tenants (
    id         TEXT    PRIMARY KEY,
    metadata   TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE destinations (
    id                         TEXT    PRIMARY KEY,
    -- Deleting a tenant deletes its destinations in the same statement.
    tenant_id                  TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    kind                       TEXT    NOT NULL,
    config                     TEXT    NOT NULL,
    -- ["*"] for every topic, else the sorted topics (sheaf_store::Topics::to_list).
    topics                     TEXT    NOT NULL,
    filter                     TEXT,
    rate_limit_per_second      INTEGER CHECK (rate_limit_per_second BETWEEN 1 AND 10000),
    headers                    TEXT    NOT NULL,
    enabled                    INTEGER NOT NULL,
    disabled_reason            TEXT,
    disabled_since             INTEGER,
    disabled_automatically     INTEGER,
    consecutive_failures       INTEGER NOT NULL CHECK (consecutive_failures >= 0),
    secret                     TEXT    NOT NULL,
    previous_secret            TEXT,
    previous_secret_expires_at INTEGER,
    created_at                 INTEGER NOT NULL,
    updated_at                 INTEGER NOT NULL,
    CHECK ((previous_secret IS NULL) = (previous_secret_expires_at IS NULL)),
    CHECK ((disabled_reason IS NULL) = (disabled_since IS NULL)
           AND (disabled_reason IS NULL) = (disabled_automatically IS NULL))
);

-- list_destinations: a tenant's destinations by id (ids sort by creation time). It also serves
-- the cascade from tenants.
CREATE INDEX destinations_by_tenant ON destinations (tenant_id, id);
