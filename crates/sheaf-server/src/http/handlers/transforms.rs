//! A transformation's dry run: a program run on a given event, or on one from the log, by the
//! same runners and limits as a delivery, answering what a receiver would get. Nothing is sent
//! and nothing is recorded.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use sheaf_store::EventId;
use sheaf_transform::{Event, Output};

use crate::http::error::ApiError;
use crate::http::extract::{ApiJson, ApiPath, AppState};

use super::destinations::compile_transform;
use super::{ApiResult, existing_tenant};

/// `{"transform": "…", "event": {"id"?, "topic", "data"}}`, or `"event_id"` in place of `event`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TryTransformInput {
    transform: String,
    #[serde(default)]
    event: Option<TryEvent>,
    #[serde(default)]
    event_id: Option<String>,
}

/// An event written for the dry run.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TryEvent {
    #[serde(default)]
    id: Option<String>,
    topic: String,
    data: Value,
}

pub(crate) async fn try_transform(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiJson(input): ApiJson<TryTransformInput>,
) -> ApiResult {
    let tenant = existing_tenant(&app, raw).await?;
    compile_transform(&input.transform).await?;
    let (id, topic, data) = match (input.event, input.event_id) {
        (Some(event), None) => (
            event.id.unwrap_or_else(|| "evt_dry_run".to_owned()),
            event.topic,
            serde_json::to_vec(&event.data).unwrap_or_default(),
        ),
        (None, Some(raw_id)) => {
            let id = EventId::new(raw_id.clone())
                .map_err(|_| ApiError::not_found(format!("event {raw_id:?} does not exist")))?;
            let event = app
                .engine
                .log()
                .get_event(&tenant, &id)
                .await?
                .ok_or_else(|| ApiError::not_found(format!("event {id} does not exist")))?;
            let data = serde_json::to_vec(event.data.value()).unwrap_or_default();
            (id.as_str().to_owned(), event.topic, data)
        }
        _ => {
            return Err(ApiError::invalid(
                "give either `event` (an event to try) or `event_id` (a logged event), not both",
            ));
        }
    };
    let event = Event {
        id: &id,
        topic: &topic,
        data: &data,
        tenant_id: tenant.as_str(),
    };
    let answer = match app.engine.try_transform(&input.transform, &event).await {
        Ok(Output::Send { body, headers }) => json!({
            "result": "send",
            "body": serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null),
            "headers": headers.into_iter().map(|(k, v)| (k, Value::String(v))).collect::<Map<_, _>>(),
            "error": null,
        }),
        Ok(Output::Drop) => json!({ "result": "drop", "body": null, "headers": {}, "error": null }),
        Err(failure) if failure.permanent => {
            json!({ "result": "failed", "body": null, "headers": {}, "error": failure.message })
        }
        Err(failure) => {
            return Err(ApiError::unavailable(format!(
                "the transformation could not be run: {}",
                failure.message
            )));
        }
    };
    Ok((StatusCode::OK, Json(answer)).into_response())
}
