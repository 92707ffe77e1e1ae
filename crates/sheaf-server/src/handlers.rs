//! The API's handlers: thin translations between JSON and the stores, the caches and
//! [`crate::publish`].

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use sheaf_store::{
    Attempt, AttemptFilter, AttemptId, AttemptStatus, Cursor, DeadLetter, Destination,
    DestinationId, DestinationKind, DestinationPatch, EventFilter, EventId, Page, PageRequest,
    TenantId, Timestamp, Topics,
};

use crate::api::{ApiJson, ApiPath, ApiQuery, AppState, Caller, OptionalJson};
use crate::core::Core;
use crate::error::ApiError;
use crate::guard::check_url;
use crate::metrics::CdcState;
use crate::publish::{PublishRequest, RetryRequest};
use crate::tokens::unix_now;
use crate::webhook::{RESERVED_HEADERS, generate_secret};

type ApiResult = Result<Response, ApiError>;

fn tenant_id(raw: String) -> Result<TenantId, ApiError> {
    crate::body::api_tenant_id(raw).map_err(ApiError::from)
}

fn destination_id(raw: &str) -> Result<DestinationId, ApiError> {
    raw.parse::<DestinationId>()
        .map_err(|_| ApiError::not_found(format!("destination {raw} does not exist")))
}

/// 404 unless the tenant exists.
async fn require_tenant(core: &Core, tenant: &TenantId) -> Result<(), ApiError> {
    let entry = core.entities.get(tenant).await?;
    if entry.tenant.is_none() {
        return Err(ApiError::unknown_tenant(tenant.as_str()));
    }
    Ok(())
}

// ---- operations ----

pub(crate) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// How long `/readyz` waits for each store's ping before calling it unreachable.
const READY_PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// A store's ping, bounded by [`READY_PING_TIMEOUT`].
async fn bounded(
    ping: impl std::future::Future<Output = sheaf_store::Result<()>>,
) -> sheaf_store::Result<()> {
    tokio::time::timeout(READY_PING_TIMEOUT, ping)
        .await
        .unwrap_or_else(|_| {
            Err(sheaf_store::Error::Unavailable {
                message: format!("no answer within {READY_PING_TIMEOUT:?}"),
                source: None,
            })
        })
}

pub(crate) async fn readyz(State(core): State<AppState>) -> ApiResult {
    let stores = &core.stores;
    // A store that is down may make a ping wait for its pool's acquire timeout; a probe must
    // get its answer sooner than that (the fault suite saw 8 of 9 probes time out during a
    // Postgres outage), so each ping has its own bound and all three run at once.
    let (log, queue, entities) = tokio::join!(
        bounded(stores.log.ping()),
        bounded(stores.queue.ping()),
        bounded(stores.entities.ping()),
    );
    let checks = [
        ("log store", log),
        ("queue", queue),
        ("entity store", entities),
    ];
    for (what, result) in checks {
        if let Err(err) = result {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                format!("the {what} is not reachable: {err}"),
            ));
        }
    }
    // The CDC source's state is reported, not required: the API and deliveries work while the
    // application's database is away, and the source catches up from its slot when it is back.
    let cdc = &core.metrics.cdc;
    let body = match cdc.state() {
        CdcState::Disabled => json!({ "status": "ready" }),
        state => json!({
            "status": "ready",
            "cdc": {
                "state": state.as_str(),
                "confirmed_lsn": sheaf_cdc::Lsn(cdc.confirmed_lsn.load(std::sync::atomic::Ordering::Relaxed)).to_string(),
                "last_error": cdc.last_error(),
            },
        }),
    };
    Ok(Json(body).into_response())
}

pub(crate) async fn metrics(State(core): State<AppState>) -> Response {
    let depth = core.stores.queue.depth().await.ok();
    let body = crate::metrics::render(&core.metric_sources, depth);
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

pub(crate) async fn openapi(State(core): State<AppState>) -> Json<Value> {
    Json(crate::openapi::document(&core.config))
}

// ---- tenants ----

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

// ---- destinations ----

fn destination_json(d: &Destination) -> Value {
    json!({
        "id": d.id,
        "tenant_id": d.tenant_id,
        "type": d.kind.as_str(),
        "topics": d.topics,
        "config": { "url": d.url },
        "headers": d.headers,
        "enabled": d.enabled,
        "credentials": {
            "secret": d.secret.expose(),
            "previous_secret": d.previous_secret.as_ref().map(|p| json!({
                "secret": p.secret.expose(),
                "expires_at": p.expires_at,
            })),
        },
        "created_at": d.created_at,
        "updated_at": d.updated_at,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebhookConfig {
    url: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DestinationInput {
    #[serde(rename = "type")]
    kind: String,
    topics: Vec<String>,
    config: WebhookConfig,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    enabled: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PatchConfig {
    #[serde(default)]
    url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DestinationPatchInput {
    #[serde(default)]
    topics: Option<Vec<String>>,
    #[serde(default)]
    config: Option<PatchConfig>,
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    enabled: Option<bool>,
}

/// Most custom headers a destination may have.
pub(crate) const MAX_CUSTOM_HEADERS: usize = 32;
/// Longest custom header name.
pub(crate) const MAX_HEADER_NAME_LEN: usize = 64;
/// Longest custom header value.
pub(crate) const MAX_HEADER_VALUE_LEN: usize = 1024;
/// Most topics in a destination's filter.
pub(crate) const MAX_TOPICS: usize = 100;

fn check_topics(topics: Vec<String>) -> Result<Topics, ApiError> {
    if topics.len() > MAX_TOPICS {
        return Err(ApiError::invalid(format!(
            "a topics filter has at most {MAX_TOPICS} entries, got {}",
            topics.len()
        )));
    }
    Ok(Topics::from_list(topics)?)
}

/// Custom headers are bounded (they go out with every delivery) and plain: token names,
/// printable ASCII values (HTTP's obsolete non-ASCII text is refused rather than guessed at).
fn check_headers(headers: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if headers.len() > MAX_CUSTOM_HEADERS {
        return Err(ApiError::invalid(format!(
            "a destination has at most {MAX_CUSTOM_HEADERS} custom headers, got {}",
            headers.len()
        )));
    }
    for (name, value) in headers {
        if name.len() > MAX_HEADER_NAME_LEN || value.len() > MAX_HEADER_VALUE_LEN {
            return Err(ApiError::invalid(format!(
                "header names are at most {MAX_HEADER_NAME_LEN} bytes and values at most {MAX_HEADER_VALUE_LEN}"
            )));
        }
        if !value
            .bytes()
            .all(|b| b == b'\t' || (0x20..=0x7e).contains(&b))
        {
            return Err(ApiError::invalid(format!(
                "the value of header {name:?} must be printable ASCII"
            )));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(ApiError::invalid(format!(
                "header {name:?} is set by sheaf and cannot be overridden"
            )));
        }
        if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(ApiError::invalid(format!(
                "{name:?} is not a valid header name"
            )));
        }
        if HeaderValue::from_str(value).is_err() {
            return Err(ApiError::invalid(format!(
                "the value of header {name:?} is not a valid header value"
            )));
        }
    }
    Ok(())
}

async fn checked_url(core: &Core, raw: &str) -> Result<String, ApiError> {
    check_url(raw, core.config.allow_private_destinations)
        .await
        .map(|url| url.to_string())
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_destination_url", e.0))
}

pub(crate) async fn create_destination(
    State(core): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiJson(input): ApiJson<DestinationInput>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    require_tenant(&core, &tenant).await?;
    let kind: DestinationKind = input.kind.parse()?;
    let topics = check_topics(input.topics)?;
    check_headers(&input.headers)?;
    let url = checked_url(&core, &input.config.url).await?;
    let now = Timestamp::now();
    let destination = Destination {
        id: DestinationId::generate(),
        tenant_id: tenant.clone(),
        kind,
        url,
        topics,
        headers: input.headers,
        enabled: input.enabled.unwrap_or(true),
        secret: generate_secret(),
        previous_secret: None,
        created_at: now,
        updated_at: now,
    };
    core.entities
        .store()
        .create_destination(&destination)
        .await?;
    core.entities.invalidate(&tenant).await;
    Ok((StatusCode::CREATED, Json(destination_json(&destination))).into_response())
}

pub(crate) async fn list_destinations(
    State(core): State<AppState>,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    require_tenant(&core, &tenant).await?;
    let list = core.entities.store().list_destinations(&tenant).await?;
    let items: Vec<Value> = list.iter().map(destination_json).collect();
    Ok(Json(json!({ "items": items })).into_response())
}

pub(crate) async fn get_destination(
    State(core): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    require_tenant(&core, &tenant).await?;
    let id = destination_id(&dest)?;
    match core.entities.store().get_destination(&tenant, &id).await? {
        Some(d) => Ok(Json(destination_json(&d)).into_response()),
        None => Err(ApiError::not_found(format!(
            "destination {id} does not exist"
        ))),
    }
}

async fn apply_patch(
    core: &Arc<Core>,
    raw: String,
    dest: &str,
    patch: DestinationPatch,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    require_tenant(core, &tenant).await?;
    let id = destination_id(dest)?;
    let updated = core
        .entities
        .store()
        .update_destination(&tenant, &id, &patch)
        .await?;
    core.entities.invalidate(&tenant).await;
    Ok(Json(destination_json(&updated)).into_response())
}

pub(crate) async fn patch_destination(
    State(core): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
    ApiJson(input): ApiJson<DestinationPatchInput>,
) -> ApiResult {
    let topics = input.topics.map(check_topics).transpose()?;
    if let Some(headers) = &input.headers {
        check_headers(headers)?;
    }
    let url = match input.config.and_then(|c| c.url) {
        Some(url) => Some(checked_url(&core, &url).await?),
        None => None,
    };
    let patch = DestinationPatch {
        url,
        topics,
        headers: input.headers,
        enabled: input.enabled,
    };
    apply_patch(&core, raw, &dest, patch).await
}

pub(crate) async fn enable_destination(
    State(core): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
) -> ApiResult {
    apply_patch(&core, raw, &dest, DestinationPatch::enabled(true)).await
}

pub(crate) async fn disable_destination(
    State(core): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
) -> ApiResult {
    apply_patch(&core, raw, &dest, DestinationPatch::enabled(false)).await
}

pub(crate) async fn delete_destination(
    State(core): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    require_tenant(&core, &tenant).await?;
    let id = destination_id(&dest)?;
    core.entities
        .store()
        .delete_destination(&tenant, &id)
        .await?;
    core.entities.invalidate(&tenant).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn rotate_secret(
    State(core): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    require_tenant(&core, &tenant).await?;
    let id = destination_id(&dest)?;
    let expires = Timestamp::now().saturating_add(core.config.secret_rotation_grace);
    let rotated = core
        .entities
        .store()
        .rotate_secret(&tenant, &id, &generate_secret(), expires)
        .await?;
    core.entities.invalidate(&tenant).await;
    Ok(Json(destination_json(&rotated)).into_response())
}

// ---- events and attempts ----

pub(crate) async fn publish(
    State(core): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<PublishRequest>,
) -> ApiResult {
    let request = crate::body::validate_publish(request)?;
    // Before the tenant is looked up: a token learns nothing about other tenants.
    caller.may_act_for(&request.tenant_id)?;
    let published = crate::publish::publish(&core, request).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "id": published.id, "duplicate": published.repeat })),
    )
        .into_response())
}

/// Default page size of listings.
const DEFAULT_LIMIT: u32 = 100;

fn page_request(limit: Option<u32>, next: Option<String>) -> Result<PageRequest, ApiError> {
    let limit = limit.unwrap_or(DEFAULT_LIMIT);
    let request = match next.filter(|n| !n.is_empty()) {
        Some(cursor) => PageRequest::after(limit, Cursor::decode(&cursor)?),
        None => PageRequest::first(limit),
    };
    request.validate()?;
    Ok(request)
}

fn page_json<T>(page: Page<T>, item: impl Fn(&T) -> Value) -> Value {
    json!({
        "items": page.items.iter().map(item).collect::<Vec<_>>(),
        "next": page.next.map(|c| c.encode()),
    })
}

#[derive(Debug, Deserialize)]
pub(crate) struct EventQuery {
    topic: Option<String>,
    limit: Option<u32>,
    next: Option<String>,
}

pub(crate) async fn list_events(
    State(core): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(query): ApiQuery<EventQuery>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    require_tenant(&core, &tenant).await?;
    let page = page_request(query.limit, query.next)?;
    let filter = EventFilter {
        // Empty means no filter, as in the attempts listing.
        topic: query.topic.filter(|t| !t.is_empty()),
        ..EventFilter::default()
    };
    let events = core.stores.log.list_events(&tenant, &filter, &page).await?;
    Ok(Json(page_json(events, |e| json!(e))).into_response())
}

pub(crate) async fn get_event(
    State(core): State<AppState>,
    ApiPath((raw, event)): ApiPath<(String, String)>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    require_tenant(&core, &tenant).await?;
    let id = EventId::new(event.clone())
        .map_err(|_| ApiError::not_found(format!("event {event:?} does not exist")))?;
    match core.stores.log.get_event(&tenant, &id).await? {
        Some(e) => Ok(Json(e).into_response()),
        None => Err(ApiError::not_found(format!("event {id} does not exist"))),
    }
}

fn attempt_json(a: &Attempt) -> Value {
    json!({
        "id": a.id,
        "event_id": a.event_id,
        "destination_id": a.destination_id,
        "number": a.number,
        "time": a.time,
        "status": a.status.as_str(),
        "trigger": a.trigger.as_str(),
        "response_code": a.response_code,
        "duration_ms": a.duration_ms,
        "response_body": a.response_body,
        "error": a.error,
        "topic": a.event_topic,
    })
}

#[derive(Debug, Deserialize)]
pub(crate) struct AttemptQuery {
    event_id: Option<String>,
    destination_id: Option<String>,
    status: Option<String>,
    topic: Option<String>,
    limit: Option<u32>,
    next: Option<String>,
}

pub(crate) async fn list_attempts(
    State(core): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(query): ApiQuery<AttemptQuery>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    require_tenant(&core, &tenant).await?;
    let page = page_request(query.limit, query.next)?;
    let filter = AttemptFilter {
        event_id: query
            .event_id
            .filter(|s| !s.is_empty())
            .map(EventId::new)
            .transpose()?,
        destination_id: query
            .destination_id
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<DestinationId>())
            .transpose()?,
        status: query
            .status
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<AttemptStatus>())
            .transpose()?,
        topic: query.topic.filter(|s| !s.is_empty()),
        ..AttemptFilter::default()
    };
    let attempts = core
        .stores
        .log
        .list_attempts(&tenant, &filter, &page)
        .await?;
    Ok(Json(page_json(attempts, attempt_json)).into_response())
}

pub(crate) async fn get_attempt(
    State(core): State<AppState>,
    ApiPath((raw, attempt)): ApiPath<(String, String)>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    require_tenant(&core, &tenant).await?;
    let id: AttemptId = attempt
        .parse()
        .map_err(|_| ApiError::not_found(format!("attempt {attempt} does not exist")))?;
    match core.stores.log.get_attempt(&tenant, &id).await? {
        Some(a) => Ok(Json(attempt_json(&a)).into_response()),
        None => Err(ApiError::not_found(format!("attempt {id} does not exist"))),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct PageQuery {
    limit: Option<u32>,
    next: Option<String>,
}

fn dead_letter_json(d: &DeadLetter) -> Value {
    json!({
        "job_id": d.job.id,
        "event_id": d.job.event_id,
        "destination_id": d.job.destination_id,
        "attempts": d.job.attempt_number,
        "last_attempt_time": d.job.last_attempt_time,
        "reason": d.reason,
        "dead_lettered_at": d.dead_lettered_at,
    })
}

pub(crate) async fn list_dead_letters(
    State(core): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    require_tenant(&core, &tenant).await?;
    let page = page_request(query.limit, query.next)?;
    let dead = core.stores.queue.list_dead_letters(&tenant, &page).await?;
    Ok(Json(page_json(dead, dead_letter_json)).into_response())
}

pub(crate) async fn retry(
    State(core): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiJson(request): ApiJson<RetryRequest>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    let event_id = request.event_id.clone();
    let destination_id = request.destination_id.clone();
    let job = crate::publish::manual_retry(&core, &tenant, request).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "job_id": job, "event_id": event_id, "destination_id": destination_id })),
    )
        .into_response())
}
