//! [`PostgresEntityStore`]: tenants and destinations, each mutation one statement.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use sheaf_store::{
    Destination, DestinationId, DestinationKind, DestinationPatch, EntityStore, Error, Filter,
    PreviousSecret, Result, Secret, Tenant, TenantId, TenantUpsert, Timestamp, Topics,
};
use sqlx::postgres::PgRow;
use sqlx::types::Json;

use crate::db::{Db, get, get_opt_time, get_time};
use crate::error::{decode, from_sqlx};

const DESTINATION_COLUMNS: &str = "id, tenant_id, kind, url, topics, headers, enabled, secret, \
     previous_secret, previous_secret_expires_at, created_at, updated_at, filter";

#[derive(Debug)]
struct Statements {
    upsert_tenant: String,
    get_tenant: String,
    delete_tenant: String,
    create_destination: String,
    get_destination: String,
    list_destinations: String,
    update_destination: String,
    rotate_secret: String,
    delete_destination: String,
}

impl Statements {
    fn new(s: &str) -> Self {
        // `updated_at` never goes back, even if the server's clock does.
        let touch = "updated_at = GREATEST(now(), updated_at)";
        Statements {
            // `xmax = 0` holds exactly for a row this statement inserted (an update through
            // ON CONFLICT stamps the old version's xmax): one statement tells created from updated.
            upsert_tenant: format!(
                "INSERT INTO {s}.tenants AS t (id, metadata, created_at, updated_at)
                 VALUES ($1, $2, now(), now())
                 ON CONFLICT (id) DO UPDATE
                     SET metadata = EXCLUDED.metadata, updated_at = GREATEST(now(), t.updated_at)
                 RETURNING id, metadata, created_at, updated_at, (xmax = 0) AS created"
            ),
            get_tenant: format!(
                "SELECT id, metadata, created_at, updated_at FROM {s}.tenants WHERE id = $1"
            ),
            // Destinations go with the tenant through ON DELETE CASCADE, in the same statement.
            delete_tenant: format!("DELETE FROM {s}.tenants WHERE id = $1"),
            // A missing tenant fails the foreign key (NotFound), a taken id the primary key
            // (Conflict), whichever tenant holds it.
            create_destination: format!(
                "INSERT INTO {s}.destinations ({DESTINATION_COLUMNS})
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
            ),
            get_destination: format!(
                "SELECT {DESTINATION_COLUMNS} FROM {s}.destinations
                 WHERE tenant_id = $1 AND id = $2"
            ),
            list_destinations: format!(
                "SELECT {DESTINATION_COLUMNS} FROM {s}.destinations
                 WHERE tenant_id = $1 ORDER BY id"
            ),
            // One statement, so two patches never race through a read-modify-write. The filter
            // can be cleared, so a flag ($7) says whether $8 replaces it.
            update_destination: format!(
                "UPDATE {s}.destinations
                 SET url = COALESCE($3, url), topics = COALESCE($4, topics),
                     headers = COALESCE($5, headers), enabled = COALESCE($6, enabled),
                     filter = CASE WHEN $7 THEN $8 ELSE filter END, {touch}
                 WHERE tenant_id = $1 AND id = $2
                 RETURNING {DESTINATION_COLUMNS}"
            ),
            // Right-hand sides read the old row: the replaced secret becomes the previous one.
            rotate_secret: format!(
                "UPDATE {s}.destinations
                 SET previous_secret = secret, previous_secret_expires_at = $4, secret = $3, {touch}
                 WHERE tenant_id = $1 AND id = $2
                 RETURNING {DESTINATION_COLUMNS}"
            ),
            delete_destination: format!(
                "DELETE FROM {s}.destinations WHERE tenant_id = $1 AND id = $2"
            ),
        }
    }
}

/// The entity store on Postgres. Cheap to clone; every clone shares the pool.
#[derive(Clone)]
pub struct PostgresEntityStore {
    db: Db,
    sql: std::sync::Arc<Statements>,
}

impl fmt::Debug for PostgresEntityStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresEntityStore")
            .field("schema", &self.db.schema())
            .finish_non_exhaustive()
    }
}

impl PostgresEntityStore {
    pub(crate) fn new(db: Db) -> Self {
        let sql = std::sync::Arc::new(Statements::new(db.schema()));
        PostgresEntityStore { db, sql }
    }
}

fn tenant_from_row(row: &PgRow) -> Result<Tenant> {
    let metadata: Json<BTreeMap<String, String>> = get(row, "metadata")?;
    Ok(Tenant {
        id: TenantId::new(get::<String>(row, "id")?)?,
        metadata: metadata.0,
        created_at: get_time(row, "created_at")?,
        updated_at: get_time(row, "updated_at")?,
    })
}

fn destination_from_row(row: &PgRow) -> Result<Destination> {
    let reading = "reading a destination";
    let kind: String = get(row, "kind")?;
    let topics: Vec<String> = get(row, "topics")?;
    let headers: Json<BTreeMap<String, String>> = get(row, "headers")?;
    let filter: Option<Json<serde_json::Value>> = get(row, "filter")?;
    let filter = filter
        .map(|Json(source)| Filter::parse(source).map_err(|e| decode(reading, e)))
        .transpose()?;
    let previous: Option<String> = get(row, "previous_secret")?;
    let previous_expires = get_opt_time(row, "previous_secret_expires_at")?;
    let previous_secret = match (previous, previous_expires) {
        (Some(secret), Some(expires_at)) => Some(PreviousSecret {
            secret: Secret::new(secret).map_err(|e| decode(reading, e))?,
            expires_at,
        }),
        _ => None,
    };
    Ok(Destination {
        id: DestinationId::from_uuid(get(row, "id")?),
        tenant_id: TenantId::new(get::<String>(row, "tenant_id")?)?,
        kind: DestinationKind::from_str(&kind).map_err(|e| decode(reading, e))?,
        url: get(row, "url")?,
        topics: Topics::from_list(topics).map_err(|e| decode(reading, e))?,
        filter,
        headers: headers.0,
        enabled: get(row, "enabled")?,
        secret: Secret::new(get::<String>(row, "secret")?).map_err(|e| decode(reading, e))?,
        previous_secret,
        created_at: get_time(row, "created_at")?,
        updated_at: get_time(row, "updated_at")?,
    })
}

fn missing_destination(tenant: &TenantId, id: &DestinationId) -> Error {
    Error::not_found(format!("destination {id} of tenant {tenant}"))
}

#[async_trait]
impl EntityStore for PostgresEntityStore {
    async fn upsert_tenant(
        &self,
        id: &TenantId,
        metadata: &BTreeMap<String, String>,
    ) -> Result<TenantUpsert> {
        let row = sqlx::query(&self.sql.upsert_tenant)
            .bind(id.as_str())
            .bind(Json(metadata))
            .fetch_one(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("upserting a tenant", e))?;
        Ok(TenantUpsert {
            tenant: tenant_from_row(&row)?,
            created: get(&row, "created")?,
        })
    }

    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        let row = sqlx::query(&self.sql.get_tenant)
            .bind(id.as_str())
            .fetch_optional(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("reading a tenant", e))?;
        row.as_ref().map(tenant_from_row).transpose()
    }

    async fn delete_tenant(&self, id: &TenantId) -> Result<()> {
        let done = sqlx::query(&self.sql.delete_tenant)
            .bind(id.as_str())
            .execute(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("deleting a tenant", e))?;
        if done.rows_affected() == 0 {
            return Err(Error::not_found(format!("tenant {id}")));
        }
        Ok(())
    }

    async fn create_destination(&self, destination: &Destination) -> Result<()> {
        let previous = destination.previous_secret.as_ref();
        sqlx::query(&self.sql.create_destination)
            .bind(destination.id.as_uuid())
            .bind(destination.tenant_id.as_str())
            .bind(destination.kind.as_str())
            .bind(destination.url.as_str())
            .bind(destination.topics.to_list())
            .bind(Json(&destination.headers))
            .bind(destination.enabled)
            .bind(destination.secret.expose())
            .bind(previous.map(|p| p.secret.expose()))
            .bind(previous.map(|p| p.expires_at.as_datetime()))
            .bind(destination.created_at.as_datetime())
            .bind(destination.updated_at.as_datetime())
            .bind(destination.filter.as_ref().map(|f| Json(f.source())))
            .execute(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("creating a destination", e))?;
        Ok(())
    }

    async fn get_destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
    ) -> Result<Option<Destination>> {
        let row = sqlx::query(&self.sql.get_destination)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_optional(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("reading a destination", e))?;
        row.as_ref().map(destination_from_row).transpose()
    }

    async fn list_destinations(&self, tenant: &TenantId) -> Result<Vec<Destination>> {
        let rows = sqlx::query(&self.sql.list_destinations)
            .bind(tenant.as_str())
            .fetch_all(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("listing destinations", e))?;
        rows.iter().map(destination_from_row).collect()
    }

    async fn update_destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        patch: &DestinationPatch,
    ) -> Result<Destination> {
        let row = sqlx::query(&self.sql.update_destination)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .bind(patch.url.as_deref())
            .bind(patch.topics.as_ref().map(Topics::to_list))
            .bind(patch.headers.as_ref().map(Json))
            .bind(patch.enabled)
            .bind(patch.filter.is_some())
            .bind(
                patch
                    .filter
                    .as_ref()
                    .and_then(Option::as_ref)
                    .map(|f| Json(f.source())),
            )
            .fetch_optional(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("updating a destination", e))?;
        match row {
            Some(row) => destination_from_row(&row),
            None => Err(missing_destination(tenant, id)),
        }
    }

    async fn rotate_secret(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        new_secret: &Secret,
        previous_expires_at: Timestamp,
    ) -> Result<Destination> {
        let row = sqlx::query(&self.sql.rotate_secret)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .bind(new_secret.expose())
            .bind(previous_expires_at.as_datetime())
            .fetch_optional(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("rotating a destination's secret", e))?;
        match row {
            Some(row) => destination_from_row(&row),
            None => Err(missing_destination(tenant, id)),
        }
    }

    async fn delete_destination(&self, tenant: &TenantId, id: &DestinationId) -> Result<()> {
        let done = sqlx::query(&self.sql.delete_destination)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .execute(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("deleting a destination", e))?;
        if done.rows_affected() == 0 {
            return Err(missing_destination(tenant, id));
        }
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        self.db.ping("entity store").await
    }
}
