//! Destinations: create, list, read, change, enable and disable, delete, rotate the signing key
//! (an HMAC secret or an Ed25519 key pair).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};
use sheaf_store::{
    Destination, DestinationId, DestinationKind, DestinationPatch, DisabledReason, Filter,
    RateLimit, Secret, Timestamp, Topics,
};

use crate::http::error::ApiError;
use crate::http::extract::App;
use crate::http::extract::{ApiJson, ApiPath, AppState};
use sheaf_destination::signing::{SigningAlgorithm, public_key};
use sheaf_destination::{ConfigError, DestinationType, Registry};
use sheaf_engine::url_password;

use crate::http::limits::{
    MAX_CUSTOM_HEADERS, MAX_HEADER_NAME_LEN, MAX_HEADER_VALUE_LEN, MAX_TOPICS,
};

use super::{ApiResult, existing_destination, existing_tenant, not_operator_tenant};

fn destination_json(d: &Destination) -> Value {
    json!({
        "id": d.id,
        "tenant_id": d.tenant_id,
        "type": d.kind.as_str(),
        "topics": d.topics,
        "filter": d.filter.as_ref().map(Filter::source),
        "rate_limit": d.rate_limit.map(|r| json!({ "per_second": r.per_second })),
        // A password in `config.url` is a credential the tenant already has; like the stored
        // form, the API never shows it again.
        "config": url_password::redacted(&d.config),
        "headers": d.headers,
        "transform": d.transform,
        "ordering": d.ordering_key.as_ref().map(|key| json!({
            "key": key,
            "on_dead_letter": if d.dead_letter_blocks_key { "block" } else { "skip" },
        })),
        "enabled": d.enabled,
        "disabled_reason": d.disabled_reason.as_ref().map(|r| json!({
            "reason": r.reason,
            "since": r.since,
            "automatic": r.automatic,
        })),
        "consecutive_failures": d.consecutive_failures,
        "credentials": credentials_json(d),
        "created_at": d.created_at,
        "updated_at": d.updated_at,
    })
}

/// How a destination signs, and what its receiver verifies with: an HMAC secret is shared, so
/// it is shown as it is; an Ed25519 private key never leaves Sheaf, and its public key is
/// shown in its place (it may be published: it cannot sign).
fn credentials_json(d: &Destination) -> Value {
    fn key(secret: &Secret) -> Value {
        match SigningAlgorithm::of(secret) {
            SigningAlgorithm::HmacSha256 => json!({
                "algorithm": SigningAlgorithm::HmacSha256.as_str(),
                "secret": secret.expose(),
                "public_key": null,
            }),
            SigningAlgorithm::Ed25519 => json!({
                "algorithm": SigningAlgorithm::Ed25519.as_str(),
                "secret": null,
                "public_key": public_key(secret),
            }),
        }
    }
    let mut credentials = key(&d.secret);
    credentials["previous_secret"] = match &d.previous_secret {
        Some(previous) => {
            let mut shown = key(&previous.secret);
            shown["expires_at"] = json!(previous.expires_at);
            shown
        }
        None => Value::Null,
    };
    credentials
}

/// `{"algorithm": "hmac-sha256" | "ed25519"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SigningInput {
    algorithm: String,
}

fn check_signing(input: SigningInput) -> Result<SigningAlgorithm, ApiError> {
    SigningAlgorithm::parse(&input.algorithm).ok_or_else(|| {
        let words: Vec<&str> = SigningAlgorithm::ALL.iter().map(|(w, _)| *w).collect();
        ApiError::invalid(format!(
            "signing.algorithm must be one of {}, got {:?}",
            words.join(", "),
            input.algorithm
        ))
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DestinationInput {
    #[serde(rename = "type")]
    kind: String,
    topics: Vec<String>,
    #[serde(default)]
    filter: Option<Value>,
    #[serde(default)]
    rate_limit: Option<RateLimitInput>,
    config: Value,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "not_null")]
    enabled: Option<bool>,
    /// Absent: HMAC-SHA256.
    #[serde(default, deserialize_with = "not_null")]
    signing: Option<SigningInput>,
    /// A jq program that reshapes each event; absent or `null`: none.
    #[serde(default)]
    transform: Option<String>,
    /// `{"key": "<JSON pointer>"}`: deliveries of one key go one at a time, in order; absent or
    /// `null`: no ordering.
    #[serde(default)]
    ordering: Option<OrderingInput>,
}

/// `{"key": "/data/order_id", "on_dead_letter": "block"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OrderingInput {
    key: String,
    /// What a dead letter does to its key; absent: `skip`.
    #[serde(default)]
    on_dead_letter: OnDeadLetter,
}

/// What a dead letter of an ordered destination does to the later events of its key.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OnDeadLetter {
    /// They go on without it; its last attempt says so.
    #[default]
    Skip,
    /// They wait until it is retried or discarded.
    Block,
}

/// The checked ordering key, and whether a dead letter blocks it (`false` without ordering).
fn check_ordering(input: Option<OrderingInput>) -> Result<(Option<String>, bool), ApiError> {
    let Some(input) = input else {
        return Ok((None, false));
    };
    sheaf_engine::body::check_ordering_key(&input.key).map_err(ApiError::invalid)?;
    let blocks = matches!(input.on_dead_letter, OnDeadLetter::Block);
    Ok((Some(input.key), blocks))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DestinationPatchInput {
    #[serde(default, deserialize_with = "not_null")]
    topics: Option<Vec<String>>,
    /// Absent: unchanged; `null`: cleared; an object: replaced.
    #[serde(default, deserialize_with = "present")]
    filter: Option<Option<Value>>,
    /// Absent: unchanged; `null`: no limit; an object: the new limit.
    #[serde(default, deserialize_with = "present")]
    rate_limit: Option<Option<RateLimitInput>>,
    /// Replaces the whole `config`, checked by the destination's type.
    #[serde(default, deserialize_with = "not_null")]
    config: Option<Value>,
    #[serde(default, deserialize_with = "not_null")]
    headers: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "not_null")]
    enabled: Option<bool>,
    /// Another algorithm rotates to a fresh key of it; the same one changes nothing.
    #[serde(default, deserialize_with = "not_null")]
    signing: Option<SigningInput>,
    /// Absent: unchanged; `null`: removed; a program: replaced.
    #[serde(default, deserialize_with = "present")]
    transform: Option<Option<String>>,
    /// Absent: unchanged; `null`: no ordering any more; an object: the new key.
    #[serde(default, deserialize_with = "present")]
    ordering: Option<Option<OrderingInput>>,
}

/// An optional field that, when given, must be a value: `null` is refused ("invalid type: null,
/// expected a boolean") rather than read as "absent", as the OpenAPI document says.
fn not_null<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// Tells a field given as `null` (`Some(None)`) from an absent one (`None`, through `default`).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(deserializer).map(Some)
}

/// `{"per_second": N}`. N is read as any JSON number, so `7.0` is 7 as JSON Schema's `integer`
/// says; a fraction or a number out of range is refused by name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimitInput {
    per_second: serde_json::Number,
}

fn check_rate_limit(input: Option<RateLimitInput>) -> Result<Option<RateLimit>, ApiError> {
    let Some(input) = input else {
        return Ok(None);
    };
    let n = &input.per_second;
    let whole = n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= f64::from(u32::MAX))
            .map(|f| f as u64)
    });
    let per_second = whole.and_then(|w| u32::try_from(w).ok()).ok_or_else(|| {
        ApiError::invalid(format!(
            "rate_limit.per_second must be a whole number from 1 to {}, got {n}",
            RateLimit::MAX
        ))
    })?;
    RateLimit::new(per_second)
        .map(Some)
        .map_err(|e| ApiError::invalid(e.to_string()))
}

/// A transformation, compiled now so that a program that cannot run is refused when it is
/// saved (`transform: line 1, column 16: expected closing brace`), never found at delivery.
/// Compiling runs no part of the program.
pub(crate) async fn check_transform(source: Option<String>) -> Result<Option<String>, ApiError> {
    let Some(source) = source else {
        return Ok(None);
    };
    compile_transform(&source).await?;
    Ok(Some(source))
}

/// Compiles `source` off the runtime's threads (the compiler takes a thread of its own).
pub(crate) async fn compile_transform(source: &str) -> Result<(), ApiError> {
    let invalid =
        |message: String| ApiError::new(StatusCode::BAD_REQUEST, "invalid_transform", message);
    if source.contains('\0') {
        return Err(invalid(
            "transform: the program contains a NUL character".to_owned(),
        ));
    }
    let owned = source.to_owned();
    tokio::task::spawn_blocking(move || sheaf_transform::Transform::compile(&owned))
        .await
        .map_err(|e| invalid(format!("transform: the compiler failed: {e}")))?
        .map(drop)
        .map_err(|e| invalid(format!("transform: {e}")))
}

/// A payload filter, refused with the path of what is wrong in it (`filter.data.total.$gte: …`).
/// `null` is the same as no filter.
fn check_filter(source: Option<Value>) -> Result<Option<Filter>, ApiError> {
    match source {
        None | Some(Value::Null) => Ok(None),
        Some(source) => Filter::parse(source)
            .map(Some)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_filter", e.to_string())),
    }
}

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
fn check_headers(
    headers: &BTreeMap<String, String>,
    destinations: &Registry,
) -> Result<(), ApiError> {
    let reserved = destinations.reserved_headers();
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
        if reserved.contains(&lower.as_str()) {
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

/// The destination type `name` names in this process, or a 400 listing the ones it has.
fn destination_type<'a>(app: &'a App, name: &str) -> Result<&'a dyn DestinationType, ApiError> {
    app.engine
        .destination_types()
        .get(name)
        .map(|k| &**k)
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "{name:?} is not a destination type; this server has {}",
                app.engine.destination_types().names().join(", ")
            ))
        })
}

/// `config` as `kind` stores it, or a 400 naming the field at fault (`config.url: …`).
/// `current` is the stored config of the destination being changed: a `config.url` whose
/// password is the redacted `***` the API shows keeps the stored password.
async fn checked_config(
    kind: &dyn DestinationType,
    config: &Value,
    current: Option<&Value>,
) -> Result<Value, ApiError> {
    let config = url_password::keep_redacted_password(config, current)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_config", e.0))?;
    kind.validate(&config)
        .await
        .map_err(|e: ConfigError| ApiError::new(StatusCode::BAD_REQUEST, e.code, e.to_string()))
}

pub(crate) async fn create_destination(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiJson(input): ApiJson<DestinationInput>,
) -> ApiResult {
    let tenant = existing_tenant(&app, raw).await?;
    not_operator_tenant(&tenant)?;
    let kind_impl = destination_type(&app, &input.kind)?;
    let kind: DestinationKind = input.kind.parse()?;
    let topics = check_topics(input.topics)?;
    let filter = check_filter(input.filter)?;
    let rate_limit = check_rate_limit(input.rate_limit)?;
    check_headers(&input.headers, app.engine.destination_types())?;
    let signing = input
        .signing
        .map(check_signing)
        .transpose()?
        .unwrap_or(SigningAlgorithm::HmacSha256);
    let config = checked_config(kind_impl, &input.config, None).await?;
    let transform = check_transform(input.transform).await?;
    let (ordering_key, dead_letter_blocks_key) = check_ordering(input.ordering)?;
    let now = Timestamp::now();
    let destination = Destination {
        id: DestinationId::generate(),
        tenant_id: tenant.clone(),
        kind,
        config,
        topics,
        filter,
        rate_limit,
        headers: input.headers,
        transform,
        ordering_key,
        dead_letter_blocks_key,
        enabled: input.enabled.unwrap_or(true),
        disabled_reason: (input.enabled == Some(false)).then(DisabledReason::by_request),
        consecutive_failures: 0,
        secret: signing.generate(),
        previous_secret: None,
        created_at: now,
        updated_at: now,
    };
    app.engine.create_destination(&destination).await?;
    Ok((StatusCode::CREATED, Json(destination_json(&destination))).into_response())
}

pub(crate) async fn list_destinations(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult {
    let tenant = existing_tenant(&app, raw).await?;
    let list = app.engine.destinations(&tenant).await?;
    let items: Vec<Value> = list.iter().map(destination_json).collect();
    Ok(Json(json!({ "items": items })).into_response())
}

pub(crate) async fn get_destination(
    State(app): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
) -> ApiResult {
    let (tenant, id) = existing_destination(&app, raw, &dest).await?;
    match app.engine.destination(&tenant, &id).await? {
        Some(d) => Ok(Json(destination_json(&d)).into_response()),
        None => Err(ApiError::not_found(format!(
            "destination {id} does not exist"
        ))),
    }
}

async fn apply_patch(
    app: &Arc<App>,
    raw: String,
    dest: &str,
    patch: DestinationPatch,
) -> ApiResult {
    apply_patch_signing(app, raw, dest, patch, None).await
}

/// Applies `patch`, then, when `signing` names an algorithm other than the current key's,
/// rotates to a fresh key of it: the old key keeps signing beside the new one for
/// `SHEAF_SECRET_ROTATION_GRACE`, as for any rotation.
async fn apply_patch_signing(
    app: &Arc<App>,
    raw: String,
    dest: &str,
    patch: DestinationPatch,
    signing: Option<SigningAlgorithm>,
) -> ApiResult {
    let (tenant, id) = existing_destination(app, raw, dest).await?;
    not_operator_tenant(&tenant)?;
    let mut updated = app.engine.update_destination(&tenant, &id, &patch).await?;
    if let Some(algorithm) = signing
        && SigningAlgorithm::of(&updated.secret) != algorithm
    {
        updated = app
            .engine
            .rotate_secret(&tenant, &id, &algorithm.generate())
            .await?;
    }
    Ok(Json(destination_json(&updated)).into_response())
}

pub(crate) async fn patch_destination(
    State(app): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
    ApiJson(input): ApiJson<DestinationPatchInput>,
) -> ApiResult {
    let topics = input.topics.map(check_topics).transpose()?;
    let filter = input.filter.map(check_filter).transpose()?;
    let rate_limit = input.rate_limit.map(check_rate_limit).transpose()?;
    let signing = input.signing.map(check_signing).transpose()?;
    if let Some(headers) = &input.headers {
        check_headers(headers, app.engine.destination_types())?;
    }
    let transform = match input.transform {
        Some(source) => Some(check_transform(source).await?),
        None => None,
    };
    // An ordering given (or null) replaces the key and what dead letters do, both at once.
    let ordering = input.ordering.map(check_ordering).transpose()?;
    let (ordering_key, dead_letter_blocks_key) = match ordering {
        Some((key, blocks)) => (Some(key), Some(blocks)),
        None => (None, None),
    };
    let config = if let Some(config) = &input.config {
        // A config is its type's to check: read the destination's type first (a type never
        // changes, so nothing races this read).
        let (tenant, id) = existing_destination(&app, raw.clone(), &dest).await?;
        not_operator_tenant(&tenant)?;
        let current = app
            .engine
            .destination(&tenant, &id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("destination {id} does not exist")))?;
        let kind = destination_type(&app, current.kind.as_str())?;
        Some(checked_config(kind, config, Some(&current.config)).await?)
    } else {
        None
    };
    let patch = DestinationPatch {
        config,
        topics,
        filter,
        rate_limit,
        headers: input.headers,
        transform,
        ordering_key,
        dead_letter_blocks_key,
        enabled: input.enabled,
        disabled_reason: (input.enabled == Some(false)).then(DisabledReason::by_request),
    };
    apply_patch_signing(&app, raw, &dest, patch, signing).await
}

pub(crate) async fn enable_destination(
    State(app): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
) -> ApiResult {
    apply_patch(&app, raw, &dest, DestinationPatch::enabled(true)).await
}

pub(crate) async fn disable_destination(
    State(app): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
) -> ApiResult {
    apply_patch(&app, raw, &dest, DestinationPatch::enabled(false)).await
}

pub(crate) async fn delete_destination(
    State(app): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
) -> ApiResult {
    let (tenant, id) = existing_destination(&app, raw, &dest).await?;
    not_operator_tenant(&tenant)?;
    app.engine.delete_destination(&tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn rotate_secret(
    State(app): State<AppState>,
    ApiPath((raw, dest)): ApiPath<(String, String)>,
) -> ApiResult {
    let (tenant, id) = existing_destination(&app, raw, &dest).await?;
    not_operator_tenant(&tenant)?;
    // A fresh key of the algorithm the destination signs with now.
    let current = app
        .engine
        .destination(&tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("destination {id} does not exist")))?;
    let rotated = app
        .engine
        .rotate_secret(
            &tenant,
            &id,
            &SigningAlgorithm::of(&current.secret).generate(),
        )
        .await?;
    Ok(Json(destination_json(&rotated)).into_response())
}
