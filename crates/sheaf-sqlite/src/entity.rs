//! [`SqliteEntityStore`]: tenants and destinations. A mutation reads the row, changes it in Rust
//! and writes it back, all in one operation of the writer: the single writer serializes
//! mutations, so no two patches race through that read-modify-write.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use rusqlite::{Connection, params};
use sheaf_store::{
    CredentialsSwap, DeliveryHealth, Destination, DestinationId, DestinationKind, DestinationPatch,
    DisabledReason, EntityStore, Error, Filter, HealthChange, PreviousSecret, RateLimit, Result,
    Secret, Tenant, TenantId, TenantUpsert, Timestamp, Topics, validate_health_reports,
};

use crate::db::{Columns, Db, first, get, get_time, get_uuid, uuid_text};
use crate::error::{Doing, decode, from_sqlx};

const DESTINATION_COLUMNS: &str = "id, tenant_id, kind, config, topics, filter, \
     rate_limit_per_second, headers, enabled, disabled_reason, disabled_since, \
     disabled_automatically, consecutive_failures, secret, previous_secret, \
     previous_secret_expires_at, created_at, updated_at, transform, ordering_key, \
     dead_letter_blocks_key";

/// The entity store on SQLite. Cheap to clone; every clone shares the connections.
#[derive(Clone)]
pub struct SqliteEntityStore {
    db: Db,
}

impl fmt::Debug for SqliteEntityStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteEntityStore")
            .field("path", &self.db.path)
            .finish_non_exhaustive()
    }
}

impl SqliteEntityStore {
    pub(crate) fn new(db: Db) -> Self {
        SqliteEntityStore { db }
    }
}

/// `now`, or `previous` if the clock has not passed it: `updated_at` never goes back.
fn touch(previous: Timestamp) -> Timestamp {
    Timestamp::now().max(previous)
}

fn json_text(value: &impl serde::Serialize, what: &str) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::invalid_input(format!("{what}: {e}")))
}

fn parse_json<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| decode(&format!("reading {what}"), e))
}

fn tenant_from_row(row: &impl Columns) -> Result<Tenant> {
    Ok(Tenant {
        id: TenantId::new(get::<String>(row, "id")?)?,
        metadata: parse_json(&get::<String>(row, "metadata")?, "a tenant's metadata")?,
        created_at: get_time(row, "created_at")?,
        updated_at: get_time(row, "updated_at")?,
    })
}

fn destination_from_row(row: &impl Columns) -> Result<Destination> {
    let reading = "reading a destination";
    let kind: String = get(row, "kind")?;
    let topics: Vec<String> = parse_json(&get::<String>(row, "topics")?, "topics")?;
    let filter: Option<String> = get(row, "filter")?;
    let filter = filter
        .map(|text| {
            parse_json(&text, "a filter")
                .and_then(|source| Filter::parse(source).map_err(|e| decode(reading, e)))
        })
        .transpose()?;
    let previous: Option<String> = get(row, "previous_secret")?;
    let previous_expires: Option<i64> = get(row, "previous_secret_expires_at")?;
    let previous_secret = match (previous, previous_expires) {
        (Some(secret), Some(expires_at)) => Some(PreviousSecret {
            secret: Secret::new(secret).map_err(|e| decode(reading, e))?,
            expires_at: Timestamp::from_micros(expires_at).map_err(|e| decode(reading, e))?,
        }),
        _ => None,
    };
    let reason: Option<String> = get(row, "disabled_reason")?;
    let since: Option<i64> = get(row, "disabled_since")?;
    let automatic: Option<bool> = get(row, "disabled_automatically")?;
    let disabled_reason = match (reason, since, automatic) {
        (Some(reason), Some(since), Some(automatic)) => Some(DisabledReason {
            reason,
            since: Timestamp::from_micros(since).map_err(|e| decode(reading, e))?,
            automatic,
        }),
        _ => None,
    };
    let failures: i64 = get(row, "consecutive_failures")?;
    let per_second: Option<i64> = get(row, "rate_limit_per_second")?;
    let rate_limit = per_second
        .map(|n| {
            u32::try_from(n)
                .map_err(|_| decode(reading, format_args!("a rate limit of {n} per second")))
                .and_then(|n| RateLimit::new(n).map_err(|e| decode(reading, e)))
        })
        .transpose()?;
    Ok(Destination {
        id: DestinationId::from_uuid(get_uuid(row, "id")?),
        tenant_id: TenantId::new(get::<String>(row, "tenant_id")?)?,
        kind: DestinationKind::from_str(&kind).map_err(|e| decode(reading, e))?,
        config: parse_json(&get::<String>(row, "config")?, "a destination's config")?,
        topics: Topics::from_list(topics).map_err(|e| decode(reading, e))?,
        filter,
        rate_limit,
        headers: parse_json(&get::<String>(row, "headers")?, "a destination's headers")?,
        transform: get(row, "transform")?,
        ordering_key: get(row, "ordering_key")?,
        dead_letter_blocks_key: get(row, "dead_letter_blocks_key")?,
        enabled: get(row, "enabled")?,
        disabled_reason,
        consecutive_failures: u32::try_from(failures).unwrap_or(u32::MAX),
        secret: Secret::new(get::<String>(row, "secret")?).map_err(|e| decode(reading, e))?,
        previous_secret,
        created_at: get_time(row, "created_at")?,
        updated_at: get_time(row, "updated_at")?,
    })
}

fn missing_destination(tenant: &TenantId, id: &DestinationId) -> Error {
    Error::not_found(format!("destination {id} of tenant {tenant}"))
}

/// The tenant's destination as the writer sees it, inside its transaction.
fn load(
    connection: &Connection,
    tenant: &TenantId,
    id: &DestinationId,
) -> Result<Option<Destination>> {
    let doing = "reading a destination";
    let mut statement = connection
        .prepare_cached(&format!(
            "SELECT {DESTINATION_COLUMNS} FROM destinations WHERE tenant_id = ?1 AND id = ?2"
        ))
        .doing(doing)?;
    let rows = statement
        .query(params![tenant.as_str(), uuid_text(id.as_uuid())])
        .doing(doing)?;
    first(rows, doing, |row| destination_from_row(row))
}

/// Writes every column of `d`: a new row (`insert`), or over the row with its id.
fn save(connection: &Connection, d: &Destination, insert: bool) -> Result<()> {
    let sql = if insert {
        format!(
            "INSERT INTO destinations ({DESTINATION_COLUMNS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                     ?18, ?19, ?20, ?21)"
        )
    } else {
        "UPDATE destinations
         SET tenant_id = ?2, kind = ?3, config = ?4, topics = ?5, filter = ?6,
             rate_limit_per_second = ?7, headers = ?8, enabled = ?9, disabled_reason = ?10,
             disabled_since = ?11, disabled_automatically = ?12, consecutive_failures = ?13,
             secret = ?14, previous_secret = ?15, previous_secret_expires_at = ?16,
             created_at = ?17, updated_at = ?18, transform = ?19, ordering_key = ?20,
             dead_letter_blocks_key = ?21
         WHERE id = ?1"
            .to_owned()
    };
    let reason = d.disabled_reason.as_ref();
    let previous = d.previous_secret.as_ref();
    let doing = "writing a destination";
    let filter = d
        .filter
        .as_ref()
        .map(|f| json_text(f.source(), "filter"))
        .transpose()?;
    connection
        .prepare_cached(&sql)
        .doing(doing)?
        .execute(params![
            uuid_text(d.id.as_uuid()),
            d.tenant_id.as_str(),
            d.kind.as_str(),
            json_text(&d.config, "config")?,
            json_text(&d.topics.to_list(), "topics")?,
            filter,
            d.rate_limit.map(|r| i64::from(r.per_second)),
            json_text(&d.headers, "headers")?,
            d.enabled,
            reason.map(|r| r.reason.as_str()),
            reason.map(|r| r.since.as_micros()),
            reason.map(|r| r.automatic),
            i64::from(d.consecutive_failures),
            d.secret.expose(),
            previous.map(|p| p.secret.expose()),
            previous.map(|p| p.expires_at.as_micros()),
            d.created_at.as_micros(),
            d.updated_at.as_micros(),
            d.transform.as_deref(),
            d.ordering_key.as_deref(),
            d.dead_letter_blocks_key,
        ])
        .doing(doing)?;
    Ok(())
}

/// One report applied to `destination` (the rules of `EntityStore::record_delivery_health`);
/// returns its changes, and whether the row needs writing.
fn apply_health(
    destination: &mut Destination,
    report: &DeliveryHealth,
    disable_after: u32,
) -> (Vec<HealthChange>, bool) {
    let old = destination.consecutive_failures;
    destination.consecutive_failures = if report.succeeded {
        report.failures_after
    } else {
        old.saturating_add(report.failures_after)
    };
    let recovered = report.succeeded && old >= disable_after;
    let disabled = destination.enabled
        && report.failures_after > 0
        && destination.consecutive_failures >= disable_after;
    if disabled {
        let now = touch(destination.updated_at);
        destination.enabled = false;
        destination.disabled_reason = Some(DisabledReason::after_failures(
            destination.consecutive_failures,
            &report.last_error,
            now,
        ));
        destination.updated_at = now;
    }
    let mut changes = Vec::new();
    if recovered {
        changes.push(HealthChange::Recovered(destination.clone()));
    }
    if disabled {
        changes.push(HealthChange::Disabled(destination.clone()));
    }
    (changes, disabled || destination.consecutive_failures != old)
}

#[async_trait]
impl EntityStore for SqliteEntityStore {
    async fn upsert_tenant(
        &self,
        id: &TenantId,
        metadata: &BTreeMap<String, String>,
    ) -> Result<TenantUpsert> {
        let (id, metadata) = (id.clone(), json_text(metadata, "metadata")?);
        self.db
            .writer
            .run("upserting a tenant", 128 + metadata.len(), move |c| {
                let doing = "upserting a tenant";
                let mut read = c
                    .prepare_cached("SELECT created_at, updated_at FROM tenants WHERE id = ?1")
                    .doing(doing)?;
                let old = first(read.query([id.as_str()]).doing(doing)?, doing, |row| {
                    Ok((get_time(row, "created_at")?, get_time(row, "updated_at")?))
                })?;
                let created = old.is_none();
                let (created_at, updated_at) = match old {
                    Some((created_at, updated_at)) => (created_at, touch(updated_at)),
                    None => {
                        let now = Timestamp::now();
                        (now, now)
                    }
                };
                let mut upsert = c
                    .prepare_cached(
                        "INSERT INTO tenants (id, metadata, created_at, updated_at)
                         VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (id) DO UPDATE
                             SET metadata = excluded.metadata, updated_at = excluded.updated_at
                         RETURNING id, metadata, created_at, updated_at",
                    )
                    .doing(doing)?;
                let rows = upsert
                    .query(params![
                        id.as_str(),
                        metadata,
                        created_at.as_micros(),
                        updated_at.as_micros(),
                    ])
                    .doing(doing)?;
                let tenant = first(rows, doing, |row| tenant_from_row(row))?
                    .ok_or_else(|| decode(doing, "the upsert returned no row"))?;
                Ok(TenantUpsert { tenant, created })
            })
            .await
    }

    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        let row =
            sqlx::query("SELECT id, metadata, created_at, updated_at FROM tenants WHERE id = ?1")
                .bind(id.as_str())
                .fetch_optional(&self.db.readers)
                .await
                .map_err(|e| from_sqlx("reading a tenant", e))?;
        row.as_ref().map(tenant_from_row).transpose()
    }

    async fn delete_tenant(&self, id: &TenantId) -> Result<()> {
        let id = id.clone();
        self.db
            .writer
            .run("deleting a tenant", 64, move |c| {
                // Destinations go with the tenant through ON DELETE CASCADE.
                let deleted = c
                    .execute("DELETE FROM tenants WHERE id = ?1", [id.as_str()])
                    .doing("deleting a tenant")?;
                if deleted == 0 {
                    return Err(Error::not_found(format!("tenant {id}")));
                }
                Ok(())
            })
            .await
    }

    async fn create_destination(&self, destination: &Destination) -> Result<()> {
        let destination = destination.clone();
        self.db
            .writer
            .run("creating a destination", 1024, move |c| {
                // A missing tenant fails the foreign key (NotFound), a taken id the primary key
                // (Conflict), whichever tenant holds it.
                save(c, &destination, true)
            })
            .await
    }

    async fn get_destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
    ) -> Result<Option<Destination>> {
        let row = sqlx::query(&format!(
            "SELECT {DESTINATION_COLUMNS} FROM destinations WHERE tenant_id = ?1 AND id = ?2"
        ))
        .bind(tenant.as_str())
        .bind(uuid_text(id.as_uuid()))
        .fetch_optional(&self.db.readers)
        .await
        .map_err(|e| from_sqlx("reading a destination", e))?;
        row.as_ref().map(destination_from_row).transpose()
    }

    async fn list_destinations(&self, tenant: &TenantId) -> Result<Vec<Destination>> {
        let rows = sqlx::query(&format!(
            "SELECT {DESTINATION_COLUMNS} FROM destinations WHERE tenant_id = ?1 ORDER BY id"
        ))
        .bind(tenant.as_str())
        .fetch_all(&self.db.readers)
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
        let (tenant, id, patch) = (tenant.clone(), *id, patch.clone());
        self.db
            .writer
            .run("updating a destination", 1024, move |c| {
                let mut destination =
                    load(c, &tenant, &id)?.ok_or_else(|| missing_destination(&tenant, &id))?;
                patch.apply_to(&mut destination);
                save(c, &destination, false)?;
                Ok(destination)
            })
            .await
    }

    async fn record_delivery_health(
        &self,
        reports: &[DeliveryHealth],
        disable_after: u32,
    ) -> Result<Vec<HealthChange>> {
        validate_health_reports(reports, disable_after)?;
        if reports.is_empty() {
            return Ok(Vec::new());
        }
        let reports = reports.to_vec();
        self.db
            .writer
            .run("recording delivery health", 128 * reports.len(), move |c| {
                let mut changes = Vec::new();
                for report in &reports {
                    let Some(mut destination) = load(c, &report.tenant_id, &report.destination_id)?
                    else {
                        continue;
                    };
                    let (changed, write) = apply_health(&mut destination, report, disable_after);
                    // A healthy destination's report changes nothing and writes nothing.
                    if write {
                        save(c, &destination, false)?;
                    }
                    changes.extend(changed);
                }
                Ok(changes)
            })
            .await
    }

    async fn rotate_secret(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        new_secret: &Secret,
        previous_expires_at: Timestamp,
    ) -> Result<Destination> {
        let (tenant, id, new_secret) = (tenant.clone(), *id, new_secret.clone());
        self.db
            .writer
            .run("rotating a destination's secret", 256, move |c| {
                let mut destination =
                    load(c, &tenant, &id)?.ok_or_else(|| missing_destination(&tenant, &id))?;
                let previous = std::mem::replace(&mut destination.secret, new_secret);
                destination.previous_secret = Some(PreviousSecret {
                    secret: previous,
                    expires_at: previous_expires_at,
                });
                destination.updated_at = touch(destination.updated_at);
                save(c, &destination, false)?;
                Ok(destination)
            })
            .await
    }

    async fn delete_destination(&self, tenant: &TenantId, id: &DestinationId) -> Result<()> {
        let (tenant, id) = (tenant.clone(), *id);
        self.db
            .writer
            .run("deleting a destination", 64, move |c| {
                let deleted = c
                    .execute(
                        "DELETE FROM destinations WHERE tenant_id = ?1 AND id = ?2",
                        params![tenant.as_str(), uuid_text(id.as_uuid())],
                    )
                    .doing("deleting a destination")?;
                if deleted == 0 {
                    return Err(missing_destination(&tenant, &id));
                }
                Ok(())
            })
            .await
    }

    async fn scan_destinations(
        &self,
        after: Option<DestinationId>,
        limit: usize,
    ) -> Result<Vec<Destination>> {
        let rows = sqlx::query(&format!(
            "SELECT {DESTINATION_COLUMNS} FROM destinations
             WHERE ?1 IS NULL OR id > ?1 ORDER BY id LIMIT ?2"
        ))
        .bind(after.map(|id| uuid_text(id.as_uuid())))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.db.readers)
        .await
        .map_err(|e| from_sqlx("scanning destinations", e))?;
        rows.iter().map(destination_from_row).collect()
    }

    async fn swap_credentials(&self, swaps: &[CredentialsSwap]) -> Result<Vec<DestinationId>> {
        if swaps.is_empty() {
            return Ok(Vec::new());
        }
        let swaps = swaps.to_vec();
        self.db
            .writer
            .run("swapping stored credentials", 512 * swaps.len(), move |c| {
                let mut swapped = Vec::new();
                for swap in &swaps {
                    let Some(mut destination) = load(c, &swap.tenant_id, &swap.destination_id)?
                    else {
                        continue;
                    };
                    // A row changed since it was read keeps its new values.
                    if sheaf_store::StoredCredentials::of(&destination) != swap.expected {
                        continue;
                    }
                    destination.secret = swap.replacement.secret.clone();
                    destination.config = swap.replacement.config.clone();
                    if let Some(previous) = &mut destination.previous_secret {
                        match &swap.replacement.previous_secret {
                            Some(secret) => previous.secret = secret.clone(),
                            None => destination.previous_secret = None,
                        }
                    }
                    save(c, &destination, false)?;
                    swapped.push(destination.id);
                }
                Ok(swapped)
            })
            .await
    }

    async fn ping(&self) -> Result<()> {
        self.db.ping("entity store").await
    }
}
