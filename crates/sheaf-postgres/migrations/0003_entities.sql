-- Tenants and destinations. Secrets are stored as given (encryption at rest comes later).

CREATE TABLE tenants (
    id         text COLLATE "C" PRIMARY KEY,
    metadata   jsonb            NOT NULL,
    created_at timestamptz      NOT NULL,
    updated_at timestamptz      NOT NULL
);

CREATE TABLE destinations (
    id                         uuid             PRIMARY KEY,
    -- Deleting a tenant deletes its destinations in the same statement.
    tenant_id                  text COLLATE "C" NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    kind                       text             NOT NULL,
    url                        text             NOT NULL,
    -- ["*"] for every topic, else the sorted topics (sheaf_store::Topics::to_list).
    topics                     text[]           NOT NULL,
    headers                    jsonb            NOT NULL,
    enabled                    boolean          NOT NULL,
    secret                     text             NOT NULL,
    previous_secret            text,
    previous_secret_expires_at timestamptz,
    created_at                 timestamptz      NOT NULL,
    updated_at                 timestamptz      NOT NULL,
    CHECK ((previous_secret IS NULL) = (previous_secret_expires_at IS NULL))
);

-- list_destinations: a tenant's destinations by id (ids sort by creation time). It also serves
-- the cascade from tenants.
CREATE INDEX destinations_by_tenant ON destinations (tenant_id, id);
