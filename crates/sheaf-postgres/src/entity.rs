//! [`PostgresEntityStore`]: tenants and destinations, each mutation one statement (a call to
//! `record_delivery_health` too, however many destinations it reports).
//!
//! Longer than 600 lines because every statement of the store sits beside the code that binds
//! it: a destination's columns, its patch's flags and their parameters are read together.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use sheaf_store::{
    CredentialsSwap, DeliveryHealth, Destination, DestinationId, DestinationKind, DestinationPatch,
    DisabledReason, EntityStore, Error, Filter, HealthChange, PreviousSecret, RateLimit, Result,
    Secret, Tenant, TenantId, TenantUpsert, Timestamp, Topics, validate_health_reports,
};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use uuid::Uuid;

use crate::db::{Db, PgQuery, get, get_opt_time, get_time, pg_text};
use crate::error::{decode, from_sqlx};

const DESTINATION_COLUMNS: &str = "id, tenant_id, kind, config, topics, headers, enabled, secret, \
     previous_secret, previous_secret_expires_at, created_at, updated_at, filter, \
     disabled_reason, disabled_since, disabled_automatically, consecutive_failures, \
     rate_limit_per_second, transform, ordering_key, dead_letter_blocks_key";

/// The largest count `consecutive_failures` (an `integer`) holds; counts saturate there, and a
/// larger limit counts as this one (`migrations/0006_destination_health.sql`).
const MAX_FAILURES: i32 = i32::MAX;

#[derive(Debug)]
struct Statements {
    upsert_tenant: String,
    get_tenant: String,
    delete_tenant: String,
    create_destination: String,
    get_destination: String,
    list_destinations: String,
    update_destination: String,
    record_delivery_health: String,
    rotate_secret: String,
    delete_destination: String,
    scan_destinations: String,
    swap_credentials: String,
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
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                         $17, $18, $19, $20, $21)"
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
            // can be cleared, so a flag ($7) says whether $8 replaces it; so can the rate limit
            // (flag $12, limit $13), the transformation (flag $14, source $15) and the ordering
            // key (flag $16, pointer $17); $18 is `dead_letter_blocks_key`. The reason ($9–$11) follows `enabled` ($6): enabling clears
            // it, disabling sets it (NULLs when the patch gives none), and no `enabled` leaves it.
            update_destination: format!(
                "UPDATE {s}.destinations
                 SET config = COALESCE($3, config), topics = COALESCE($4, topics),
                     headers = COALESCE($5, headers), enabled = COALESCE($6, enabled),
                     filter = CASE WHEN $7 THEN $8 ELSE filter END,
                     rate_limit_per_second = CASE WHEN $12 THEN $13::integer
                                                  ELSE rate_limit_per_second END,
                     transform = CASE WHEN $14 THEN $15::text ELSE transform END,
                     ordering_key = CASE WHEN $16 THEN $17::text ELSE ordering_key END,
                     dead_letter_blocks_key = COALESCE($18, dead_letter_blocks_key),
                     disabled_reason = CASE $6 WHEN true THEN NULL WHEN false THEN $9
                                           ELSE disabled_reason END,
                     disabled_since = CASE $6 WHEN true THEN NULL WHEN false THEN $10
                                          ELSE disabled_since END,
                     disabled_automatically = CASE $6 WHEN true THEN NULL WHEN false THEN $11
                                                  ELSE disabled_automatically END,
                     {touch}
                 WHERE tenant_id = $1 AND id = $2
                 RETURNING {DESTINATION_COLUMNS}"
            ),
            // `EntityStore::record_delivery_health` as one statement over the unnested reports.
            // RETURNING sees only the new row, and what changed depends on the old count and
            // `enabled`, so `locked` reads them first, locking the rows: in READ COMMITTED a
            // row another transaction changed meanwhile is re-read at its latest committed
            // version (and the join re-checked), and the UPDATE then writes over that same
            // version, so no report is lost to a concurrent one. Rows are locked in id order, so
            // two processes reporting the same destinations wait for each other instead of
            // deadlocking (tests/entity.rs fails without either). A report that changes nothing
            // (a success with as many failures after it as the stored count, below the limit:
            // every healthy destination, every batch) locks and writes nothing, so health
            // reports do not churn the table; judged on the statement's snapshot, it is as if it
            // came just before a concurrent change.
            //
            // $4 is bigint (failures are a u32) and the count saturates at MAX_FAILURES; $6, the
            // limit, is already clamped to it. `updated_at` moves only when a destination is
            // disabled, by the rule of every mutation here, and the reason's `since` is that new
            // `updated_at` (as in the memory store). The reason's words are
            // `DisabledReason::after_failures`'s, which the conformance suite compares exactly.
            record_delivery_health: format!(
                "WITH input AS (
                     SELECT *
                     FROM unnest($1::text[], $2::uuid[], $3::boolean[], $4::bigint[], $5::text[])
                         WITH ORDINALITY
                         AS r(tenant_id, id, succeeded, failures_after, last_error, report_index)
                 ),
                 locked AS MATERIALIZED (
                     SELECT i.report_index, d.id AS locked_id, i.succeeded, i.failures_after,
                            i.last_error, d.consecutive_failures AS old_failures,
                            d.enabled AS was_enabled
                     FROM {s}.destinations d
                     JOIN input i ON i.tenant_id = d.tenant_id AND i.id = d.id
                     WHERE NOT (i.succeeded AND i.failures_after = d.consecutive_failures
                                AND d.consecutive_failures < $6::bigint)
                     ORDER BY d.id
                     FOR UPDATE OF d
                 ),
                 decided AS (
                     SELECT report_index, locked_id, failures, last_error,
                            succeeded AND old_failures >= $6 AS recovered,
                            was_enabled AND failures_after > 0 AND failures >= $6 AS disabled
                     FROM (SELECT l.*,
                                  LEAST(CASE WHEN l.succeeded THEN l.failures_after
                                             ELSE l.old_failures + l.failures_after END,
                                        {MAX_FAILURES}) AS failures
                           FROM locked l) AS l
                 )
                 UPDATE {s}.destinations d
                 SET consecutive_failures = x.failures,
                     enabled = d.enabled AND NOT x.disabled,
                     disabled_reason = CASE WHEN x.disabled
                         THEN format('%s consecutive failed attempts; the last: %s',
                                     x.failures, x.last_error)
                         ELSE d.disabled_reason END,
                     disabled_since = CASE WHEN x.disabled THEN GREATEST(now(), d.updated_at)
                                          ELSE d.disabled_since END,
                     disabled_automatically = CASE WHEN x.disabled THEN true
                                                  ELSE d.disabled_automatically END,
                     updated_at = CASE WHEN x.disabled THEN GREATEST(now(), d.updated_at)
                                      ELSE d.updated_at END
                 FROM decided x
                 WHERE d.id = x.locked_id
                 RETURNING {DESTINATION_COLUMNS}, x.report_index, x.recovered, x.disabled"
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
            // Keyset paging on the primary key: each page is one index range scan, however far
            // the pass has come.
            scan_destinations: format!(
                "SELECT {DESTINATION_COLUMNS} FROM {s}.destinations
                 WHERE $1::uuid IS NULL OR id > $1
                 ORDER BY id LIMIT $2"
            ),
            // One compare-and-set per swap, all in one statement: a row changed since it was
            // read (a rotation, a new config) keeps its new values and is not returned. Under
            // READ COMMITTED the UPDATE re-checks its WHERE on the latest committed version of a
            // row another transaction is changing, so the comparison is never against a stale
            // one. `updated_at` stays: the credentials are the same, in another form.
            swap_credentials: format!(
                "UPDATE {s}.destinations d
                 SET secret = u.new_secret, previous_secret = u.new_previous,
                     config = u.new_config
                 FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::text[],
                             $6::text[], $7::jsonb[], $8::jsonb[])
                     AS u(tenant_id, id, old_secret, new_secret, old_previous, new_previous,
                          old_config, new_config)
                 WHERE d.tenant_id = u.tenant_id AND d.id = u.id
                   AND d.secret = u.old_secret
                   AND d.previous_secret IS NOT DISTINCT FROM u.old_previous
                   AND d.config = u.old_config
                 RETURNING d.id"
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

/// Binds a text field a patch can replace or clear: whether it names it, then the new text.
fn bind_replaced<'q>(query: PgQuery<'q>, field: &'q Option<Option<String>>) -> PgQuery<'q> {
    query
        .bind(field.is_some())
        .bind(field.as_ref().and_then(Option::as_deref).map(pg_text))
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
    let reason: Option<String> = get(row, "disabled_reason")?;
    let since = get_opt_time(row, "disabled_since")?;
    let automatic: Option<bool> = get(row, "disabled_automatically")?;
    let disabled_reason = match (reason, since, automatic) {
        (Some(reason), Some(since), Some(automatic)) => Some(DisabledReason {
            reason,
            since,
            automatic,
        }),
        _ => None,
    };
    let failures: i32 = get(row, "consecutive_failures")?;
    let consecutive_failures = u32::try_from(failures)
        .map_err(|_| decode(reading, format_args!("{failures} consecutive failures")))?;
    let per_second: Option<i32> = get(row, "rate_limit_per_second")?;
    let rate_limit = per_second
        .map(|n| {
            u32::try_from(n)
                .map_err(|_| decode(reading, format_args!("a rate limit of {n} per second")))
                .and_then(|n| RateLimit::new(n).map_err(|e| decode(reading, e)))
        })
        .transpose()?;
    Ok(Destination {
        id: DestinationId::from_uuid(get(row, "id")?),
        tenant_id: TenantId::new(get::<String>(row, "tenant_id")?)?,
        kind: DestinationKind::from_str(&kind).map_err(|e| decode(reading, e))?,
        config: get::<Json<serde_json::Value>>(row, "config")?.0,
        topics: Topics::from_list(topics).map_err(|e| decode(reading, e))?,
        filter,
        rate_limit,
        headers: headers.0,
        transform: get(row, "transform")?,
        ordering_key: get(row, "ordering_key")?,
        dead_letter_blocks_key: get(row, "dead_letter_blocks_key")?,
        enabled: get(row, "enabled")?,
        disabled_reason,
        consecutive_failures,
        secret: Secret::new(get::<String>(row, "secret")?).map_err(|e| decode(reading, e))?,
        previous_secret,
        created_at: get_time(row, "created_at")?,
        updated_at: get_time(row, "updated_at")?,
    })
}

/// A count (or a limit) as `consecutive_failures` holds it, saturating at [`MAX_FAILURES`].
fn saturated(count: u32) -> i32 {
    i32::try_from(count).unwrap_or(MAX_FAILURES)
}

/// A rate limit as `rate_limit_per_second` holds it. [`RateLimit::new`] bounds it to 10,000, so
/// it always fits; saturating keeps that from being a panic if the bound ever grows.
fn per_second(limit: RateLimit) -> i32 {
    i32::try_from(limit.per_second).unwrap_or(i32::MAX)
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
        let reason = destination.disabled_reason.as_ref();
        sqlx::query(&self.sql.create_destination)
            .bind(destination.id.as_uuid())
            .bind(destination.tenant_id.as_str())
            .bind(destination.kind.as_str())
            .bind(Json(&destination.config))
            .bind(destination.topics.to_list())
            .bind(Json(&destination.headers))
            .bind(destination.enabled)
            .bind(destination.secret.expose())
            .bind(previous.map(|p| p.secret.expose()))
            .bind(previous.map(|p| p.expires_at.as_datetime()))
            .bind(destination.created_at.as_datetime())
            .bind(destination.updated_at.as_datetime())
            .bind(destination.filter.as_ref().map(|f| Json(f.source())))
            .bind(reason.map(|r| pg_text(&r.reason)))
            .bind(reason.map(|r| r.since.as_datetime()))
            .bind(reason.map(|r| r.automatic))
            .bind(saturated(destination.consecutive_failures))
            .bind(destination.rate_limit.map(per_second))
            .bind(destination.transform.as_deref().map(pg_text))
            .bind(destination.ordering_key.as_deref().map(pg_text))
            .bind(destination.dead_letter_blocks_key)
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
        let reason = patch.disabled_reason.as_ref();
        let query = sqlx::query(&self.sql.update_destination)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .bind(patch.config.as_ref().map(Json))
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
            .bind(reason.map(|r| pg_text(&r.reason)))
            .bind(reason.map(|r| r.since.as_datetime()))
            .bind(reason.map(|r| r.automatic))
            .bind(patch.rate_limit.is_some())
            .bind(patch.rate_limit.flatten().map(per_second));
        let row = bind_replaced(bind_replaced(query, &patch.transform), &patch.ordering_key)
            .bind(patch.dead_letter_blocks_key)
            .fetch_optional(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("updating a destination", e))?;
        match row {
            Some(row) => destination_from_row(&row),
            None => Err(missing_destination(tenant, id)),
        }
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
        let tenants: Vec<&str> = reports.iter().map(|r| r.tenant_id.as_str()).collect();
        let ids: Vec<Uuid> = reports.iter().map(|r| r.destination_id.as_uuid()).collect();
        let succeeded: Vec<bool> = reports.iter().map(|r| r.succeeded).collect();
        let failures: Vec<i64> = reports
            .iter()
            .map(|r| i64::from(r.failures_after))
            .collect();
        let errors: Vec<String> = reports.iter().map(|r| pg_text(&r.last_error)).collect();
        let rows = sqlx::query(&self.sql.record_delivery_health)
            .bind(&tenants)
            .bind(&ids)
            .bind(&succeeded)
            .bind(&failures)
            .bind(&errors)
            .bind(i64::from(saturated(disable_after)))
            .fetch_all(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("recording delivery health", e))?;
        // RETURNING comes in no particular order; the changes go in the reports' order.
        let mut changed = Vec::new();
        for row in &rows {
            let recovered: bool = get(row, "recovered")?;
            let disabled: bool = get(row, "disabled")?;
            if recovered || disabled {
                let index: i64 = get(row, "report_index")?;
                changed.push((index, recovered, disabled, destination_from_row(row)?));
            }
        }
        changed.sort_unstable_by_key(|(index, ..)| *index);
        let mut changes = Vec::with_capacity(changed.len());
        for (_, recovered, disabled, destination) in changed {
            // Both come from one report when the failures after its success reach the limit
            // again; each carries the destination as stored afterwards.
            if recovered {
                changes.push(HealthChange::Recovered(destination.clone()));
            }
            if disabled {
                changes.push(HealthChange::Disabled(destination));
            }
        }
        Ok(changes)
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

    async fn scan_destinations(
        &self,
        after: Option<DestinationId>,
        limit: usize,
    ) -> Result<Vec<Destination>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = sqlx::query(&self.sql.scan_destinations)
            .bind(after.map(|id| id.as_uuid()))
            .bind(limit)
            .fetch_all(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("scanning destinations", e))?;
        rows.iter().map(destination_from_row).collect()
    }

    async fn swap_credentials(&self, swaps: &[CredentialsSwap]) -> Result<Vec<DestinationId>> {
        if swaps.is_empty() {
            return Ok(Vec::new());
        }
        let column = |pick: fn(&CredentialsSwap) -> Option<&Secret>| -> Vec<Option<String>> {
            swaps
                .iter()
                .map(|s| pick(s).map(|secret| secret.expose().to_owned()))
                .collect()
        };
        let rows = sqlx::query(&self.sql.swap_credentials)
            .bind(
                swaps
                    .iter()
                    .map(|s| s.tenant_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                swaps
                    .iter()
                    .map(|s| s.destination_id.as_uuid())
                    .collect::<Vec<_>>(),
            )
            .bind(column(|s| Some(&s.expected.secret)))
            .bind(column(|s| Some(&s.replacement.secret)))
            .bind(column(|s| s.expected.previous_secret.as_ref()))
            .bind(column(|s| s.replacement.previous_secret.as_ref()))
            .bind(
                swaps
                    .iter()
                    .map(|s| Json(&s.expected.config))
                    .collect::<Vec<_>>(),
            )
            .bind(
                swaps
                    .iter()
                    .map(|s| Json(&s.replacement.config))
                    .collect::<Vec<_>>(),
            )
            .fetch_all(&self.db.pool)
            .await
            .map_err(|e| from_sqlx("swapping stored credentials", e))?;
        rows.iter()
            .map(|row| get::<Uuid>(row, "id").map(DestinationId::from_uuid))
            .collect()
    }

    async fn ping(&self) -> Result<()> {
        self.db.ping("entity store").await
    }
}
