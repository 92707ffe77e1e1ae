//! Tenants, and the tenant-scoped tokens an admin issues for them.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::http::error::ApiError;
use crate::http::extract::{ApiPath, AppState, OptionalJson};
use crate::http::tokens::unix_now;

use super::{ApiResult, not_operator_tenant, require_tenant, tenant_id};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantInput {
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

pub(crate) async fn put_tenant(
    State(core): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    OptionalJson(input): OptionalJson<TenantInput>,
) -> ApiResult {
    let id = tenant_id(raw)?;
    not_operator_tenant(&id)?;
    let metadata = input.map(|i| i.metadata).unwrap_or_default();
    let upsert = core.entities.store().upsert_tenant(&id, &metadata).await?;
    core.entities.invalidate(&id).await;
    let status = if upsert.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(upsert.tenant)).into_response())
}

pub(crate) async fn get_tenant(
    State(core): State<AppState>,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult {
    let id = tenant_id(raw)?;
    match core.entities.store().get_tenant(&id).await? {
        Some(tenant) => Ok(Json(tenant).into_response()),
        None => Err(ApiError::unknown_tenant(id.as_str())),
    }
}

pub(crate) async fn delete_tenant(
    State(core): State<AppState>,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult {
    let id = tenant_id(raw)?;
    not_operator_tenant(&id)?;
    core.entities
        .store()
        .delete_tenant(&id)
        .await
        .map_err(|e| {
            if e.kind() == sheaf_store::ErrorKind::NotFound {
                ApiError::unknown_tenant(id.as_str())
            } else {
                ApiError::from(e)
            }
        })?;
    core.entities.invalidate(&id).await;
    // Its pending deliveries stop: the jobs go, and a worker holding one finds no destination.
    core.stores.queue.purge_tenant(&id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

// ---- tenant tokens ----

/// Lifetime of a token issued without `ttl_seconds`.
const DEFAULT_TOKEN_TTL_SECS: u64 = 3600;

/// Shortest lifetime a token may be issued with: anything shorter expires in transit.
const MIN_TOKEN_TTL_SECS: u64 = 60;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenInput {
    /// A JSON number: `3600.0` is an integer to JSON Schema, so it is one here too.
    #[serde(default)]
    ttl_seconds: Option<serde_json::Number>,
}

/// A whole, non-negative number of seconds, or why not.
fn whole_seconds(n: &serde_json::Number) -> Result<u64, ApiError> {
    if let Some(secs) = n.as_u64() {
        return Ok(secs);
    }
    match n.as_f64() {
        // Exact below 2^53; anything that large is far above every bound anyway.
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f < 9_007_199_254_740_992.0 => Ok(f as u64),
        _ => Err(ApiError::invalid(format!(
            "ttl_seconds must be a whole number of seconds, got {n}"
        ))),
    }
}

fn unix_time_json(secs: i64) -> Value {
    chrono::DateTime::from_timestamp(secs, 0).map_or(Value::Null, |t| {
        json!(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
    })
}

pub(crate) async fn issue_token(
    State(core): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    OptionalJson(input): OptionalJson<TokenInput>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    let Some(key) = core.config.token_signing_key.as_ref() else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "tokens_disabled",
            "tenant tokens are not enabled on this server: set SHEAF_TOKEN_SIGNING_KEY",
        ));
    };
    let ttl = match input.and_then(|i| i.ttl_seconds) {
        Some(n) => whole_seconds(&n)?,
        None => DEFAULT_TOKEN_TTL_SECS,
    };
    let max = core.config.token_max_ttl.as_secs();
    if !(MIN_TOKEN_TTL_SECS..=max).contains(&ttl) {
        return Err(ApiError::invalid(format!(
            "ttl_seconds must be {MIN_TOKEN_TTL_SECS} to {max} (SHEAF_TOKEN_MAX_TTL), got {ttl}"
        )));
    }
    require_tenant(&core, &tenant).await?;
    let (token, claims) = key.issue(&tenant, std::time::Duration::from_secs(ttl), unix_now());
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "token": token,
            "id": claims.id,
            "tenant_id": claims.tenant,
            "issued_at": unix_time_json(claims.iat),
            "expires_at": unix_time_json(claims.exp),
        })),
    )
        .into_response())
}
