//! Tenants, and the tenant-scoped tokens an admin issues for them.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::http::error::ApiError;
use crate::http::extract::{ApiPath, AppState, OptionalJson};
use crate::http::tokens::{TokenClaims, unix_now};

use super::{ApiResult, not_operator_tenant, require_tenant, tenant_id};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantInput {
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

pub(crate) async fn put_tenant(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    OptionalJson(input): OptionalJson<TenantInput>,
) -> ApiResult {
    let id = tenant_id(raw)?;
    not_operator_tenant(&id)?;
    let metadata = input.map(|i| i.metadata).unwrap_or_default();
    let upsert = app.engine.upsert_tenant(&id, &metadata).await?;
    let status = if upsert.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(upsert.tenant)).into_response())
}

pub(crate) async fn get_tenant(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult {
    let id = tenant_id(raw)?;
    match app.engine.stored_tenant(&id).await? {
        Some(tenant) => Ok(Json(tenant).into_response()),
        None => Err(ApiError::unknown_tenant(id.as_str())),
    }
}

pub(crate) async fn delete_tenant(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult {
    let id = tenant_id(raw)?;
    not_operator_tenant(&id)?;
    app.engine.delete_tenant(&id).await.map_err(|e| {
        if e.kind() == sheaf_store::ErrorKind::NotFound {
            ApiError::unknown_tenant(id.as_str())
        } else {
            ApiError::from(e)
        }
    })?;
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

/// Checks a token request and issues one for `tenant`, `ttl` seconds from now (`default_ttl`
/// when the request names none, held within `SHEAF_TOKEN_MAX_TTL`).
async fn mint(
    app: &AppState,
    tenant: &sheaf_store::TenantId,
    input: Option<TokenInput>,
    default_ttl: u64,
) -> Result<(String, TokenClaims), ApiError> {
    let Some(key) = app.config.token_signing_key.as_ref() else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "tokens_disabled",
            "tenant tokens are not enabled on this server: set SHEAF_TOKEN_SIGNING_KEY",
        ));
    };
    let max = app.config.token_max_ttl.as_secs();
    let ttl = match input.and_then(|i| i.ttl_seconds) {
        Some(n) => whole_seconds(&n)?,
        None => default_ttl.min(max),
    };
    if !(MIN_TOKEN_TTL_SECS..=max).contains(&ttl) {
        return Err(ApiError::invalid(format!(
            "ttl_seconds must be {MIN_TOKEN_TTL_SECS} to {max} (SHEAF_TOKEN_MAX_TTL), got {ttl}"
        )));
    }
    require_tenant(app, tenant).await?;
    Ok(key.issue(tenant, std::time::Duration::from_secs(ttl), unix_now()))
}

pub(crate) async fn issue_token(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    OptionalJson(input): OptionalJson<TokenInput>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    let (token, claims) = mint(&app, &tenant, input, DEFAULT_TOKEN_TTL_SECS).await?;
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

// ---- portal links ----

/// Lifetime of a portal link issued without `ttl_seconds`: long enough to look around, short
/// enough that a link pasted somewhere stops working the same day.
const DEFAULT_PORTAL_TTL_SECS: u64 = 3600;

/// A link to the portal for one tenant: a fresh tenant token in the URL's fragment, which
/// browsers never send to a server nor put in a `Referer`; the portal reads it, keeps it in
/// memory and takes it out of the address bar.
pub(crate) async fn issue_portal_link(
    State(app): State<AppState>,
    headers: HeaderMap,
    ApiPath(raw): ApiPath<String>,
    OptionalJson(input): OptionalJson<TokenInput>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    let (token, claims) = mint(&app, &tenant, input, DEFAULT_PORTAL_TTL_SECS).await?;
    let expires_at = unix_time_json(claims.exp);
    let base = match &app.config.public_url {
        Some(url) => url.clone(),
        None => format!("http://{}", request_host(&headers, app.config.listen)),
    };
    // `name=value` pairs as a form encodes them, which `URLSearchParams` reads back.
    let fragment = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("tenant", tenant.as_str())
        .append_pair("token", &token)
        .append_pair("expires", expires_at.as_str().unwrap_or_default())
        .finish();
    let url = format!("{base}/portal/#{fragment}");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "url": url,
            "token": token,
            "tenant_id": claims.tenant,
            "expires_at": expires_at,
        })),
    )
        .into_response())
}

/// The `Host` the client used when it is a plain `host[:port]`, else the listen address.
fn request_host(headers: &HeaderMap, listen: std::net::SocketAddr) -> String {
    headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .map_or_else(|| listen.to_string(), str::to_owned)
}
