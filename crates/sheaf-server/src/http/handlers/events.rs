//! Publish, the event and attempt logs, dead letters and manual retries.

use std::str::FromStr;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};
use sheaf_store::{
    Attempt, AttemptFilter, AttemptId, AttemptStatus, Buckets, Cursor, DeadLetter, DestinationId,
    EventFilter, EventId, JobId, Page, PageRequest, TenantId, TimeRange, Timestamp,
};

use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::extract::{ApiJson, ApiPath, ApiQuery, AppState, PublishPlace};
use sheaf_engine::body::PublishRequest;
use sheaf_engine::requests::RetryRequest;

use super::{ApiResult, existing_tenant, not_operator_tenant, tenant_id};

pub(crate) async fn publish(
    State(app): State<AppState>,
    caller: Caller,
    // Before the body is read: past the bound a publish is refused without reading it.
    _place: PublishPlace,
    ApiJson(request): ApiJson<PublishRequest>,
) -> ApiResult {
    let request = sheaf_engine::body::validate_publish(request)?;
    // Before the tenant is looked up: a token learns nothing about other tenants.
    caller.may_act_for(&request.tenant_id)?;
    not_operator_tenant(&request.tenant_id)?;
    let published = app.engine.publish(request).await?;
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

/// `since` (inclusive) and `until` (exclusive) as RFC 3339 times; absent means unbounded, and
/// an empty value is refused like any other that is not a time.
fn time_range(since: Option<String>, until: Option<String>) -> Result<TimeRange, ApiError> {
    let parse = |name: &str, raw: Option<String>| {
        raw.map(|s| {
            s.parse::<Timestamp>().map_err(|_| {
                ApiError::invalid(format!(
                    "{name} must be an RFC 3339 time such as 2026-12-01T09:30:00Z, got {s:?}"
                ))
            })
        })
        .transpose()
    };
    let range = TimeRange {
        since: parse("since", since)?,
        until: parse("until", until)?,
    };
    if let (Some(since), Some(until)) = (range.since, range.until)
        && since >= until
    {
        return Err(ApiError::invalid("since must be before until"));
    }
    Ok(range)
}

#[derive(Debug, Deserialize)]
pub(crate) struct EventQuery {
    topic: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<u32>,
    next: Option<String>,
}

pub(crate) async fn list_events(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(query): ApiQuery<EventQuery>,
) -> ApiResult {
    let tenant = existing_tenant(&app, raw).await?;
    let page = page_request(query.limit, query.next)?;
    let filter = EventFilter {
        // Empty means no filter, as in the attempts listing.
        topic: query.topic.filter(|t| !t.is_empty()),
        time: time_range(query.since, query.until)?,
    };
    let events = app
        .engine
        .log()
        .list_events(&tenant, &filter, &page)
        .await?;
    Ok(Json(page_json(events, |e| json!(e))).into_response())
}

pub(crate) async fn get_event(
    State(app): State<AppState>,
    ApiPath((raw, event)): ApiPath<(String, String)>,
) -> ApiResult {
    let tenant = existing_tenant(&app, raw).await?;
    let id = EventId::new(event.clone())
        .map_err(|_| ApiError::not_found(format!("event {event:?} does not exist")))?;
    match app.engine.log().get_event(&tenant, &id).await? {
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
    since: Option<String>,
    until: Option<String>,
    limit: Option<u32>,
    next: Option<String>,
}

pub(crate) async fn list_attempts(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(query): ApiQuery<AttemptQuery>,
) -> ApiResult {
    let tenant = existing_tenant(&app, raw).await?;
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
        time: time_range(query.since, query.until)?,
    };
    let attempts = app
        .engine
        .log()
        .list_attempts(&tenant, &filter, &page)
        .await?;
    Ok(Json(page_json(attempts, attempt_json)).into_response())
}

pub(crate) async fn get_attempt(
    State(app): State<AppState>,
    ApiPath((raw, attempt)): ApiPath<(String, String)>,
) -> ApiResult {
    let tenant = existing_tenant(&app, raw).await?;
    let id: AttemptId = attempt
        .parse()
        .map_err(|_| ApiError::not_found(format!("attempt {attempt} does not exist")))?;
    match app.engine.log().get_attempt(&tenant, &id).await? {
        Some(a) => Ok(Json(attempt_json(&a)).into_response()),
        None => Err(ApiError::not_found(format!("attempt {id} does not exist"))),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct StatsQuery {
    minutes: Option<u32>,
}

/// Longest window the attempt counts cover: a day of one-minute buckets.
const MAX_STATS_MINUTES: u32 = 1440;

/// Attempts per minute by status over the last `minutes` (60 by default), the current minute
/// last: what the portal's chart draws, counted by the log store in one query.
pub(crate) async fn attempt_stats(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(query): ApiQuery<StatsQuery>,
) -> ApiResult {
    let tenant = existing_tenant(&app, raw).await?;
    let minutes = query.minutes.unwrap_or(60);
    if !(1..=MAX_STATS_MINUTES).contains(&minutes) {
        return Err(ApiError::invalid(format!(
            "minutes must be 1 to {MAX_STATS_MINUTES}, got {minutes}"
        )));
    }
    const MINUTE_US: i64 = 60_000_000;
    let now = Timestamp::now().as_micros();
    let this_minute = now - now.rem_euclid(MINUTE_US);
    let since = Timestamp::from_micros(this_minute - i64::from(minutes - 1) * MINUTE_US)?;
    let buckets = Buckets::new(since, std::time::Duration::from_secs(60), minutes)?;
    let counts = app.engine.log().count_attempts(&tenant, &buckets).await?;
    Ok(Json(json!({
        "from": buckets.since,
        "to": buckets.until(),
        "bucket_seconds": 60,
        "buckets": counts,
    }))
    .into_response())
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
        "blocks_key": d.holds_key,
    })
}

pub(crate) async fn list_dead_letters(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> ApiResult {
    let tenant = existing_tenant(&app, raw).await?;
    let page = page_request(query.limit, query.next)?;
    let dead = app.engine.dead_letters(&tenant, &page).await?;
    Ok(Json(page_json(dead, dead_letter_json)).into_response())
}

/// The tenant and the dead letter a path names; an id that is not a job id names none.
async fn dead_letter_path(
    app: &AppState,
    raw: String,
    job: &str,
) -> Result<(TenantId, JobId), ApiError> {
    let tenant = existing_tenant(app, raw).await?;
    not_operator_tenant(&tenant)?;
    let id = JobId::from_str(job).map_err(|_| no_dead_letter(job))?;
    Ok((tenant, id))
}

fn no_dead_letter(job: impl std::fmt::Display) -> ApiError {
    ApiError::not_found(format!("dead letter {job} does not exist"))
}

/// Delivers a dead letter again: back in the queue, due now, as attempt 1. A dead letter that
/// blocks its ordering key goes back in its place, so the key goes on in order.
pub(crate) async fn retry_dead_letter(
    State(app): State<AppState>,
    ApiPath((raw, job)): ApiPath<(String, String)>,
) -> ApiResult {
    let (tenant, id) = dead_letter_path(&app, raw, &job).await?;
    if !app.engine.requeue_dead_letter(&tenant, id).await? {
        return Err(no_dead_letter(id));
    }
    Ok((StatusCode::ACCEPTED, Json(json!({ "job_id": id }))).into_response())
}

/// Discards a dead letter without delivering it; one that blocked its ordering key lets the
/// key's next event go.
pub(crate) async fn discard_dead_letter(
    State(app): State<AppState>,
    ApiPath((raw, job)): ApiPath<(String, String)>,
) -> ApiResult {
    let (tenant, id) = dead_letter_path(&app, raw, &job).await?;
    if !app.engine.discard_dead_letter(&tenant, id).await? {
        return Err(no_dead_letter(id));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn retry(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiJson(request): ApiJson<RetryRequest>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    let event_id = request.event_id.clone();
    let destination_id = request.destination_id.clone();
    let job = app.engine.retry(&tenant, request).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "job_id": job, "event_id": event_id, "destination_id": destination_id })),
    )
        .into_response())
}
