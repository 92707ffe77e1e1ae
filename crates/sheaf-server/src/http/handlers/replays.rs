//! Bulk replays: start one, read its progress (from the shared replay store, so any process
//! answers for any replay).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use uuid::Uuid;

use crate::http::error::ApiError;
use crate::http::extract::{ApiJson, ApiPath, AppState};
use sheaf_engine::requests::ReplayRequest;

use super::{ApiResult, existing_tenant, tenant_id};

pub(crate) async fn replay(
    State(app): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiJson(request): ApiJson<ReplayRequest>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    let progress = app.engine.replay(&tenant, request).await?;
    Ok((StatusCode::ACCEPTED, Json(progress)).into_response())
}

pub(crate) async fn get_replay(
    State(app): State<AppState>,
    ApiPath((raw, id)): ApiPath<(String, String)>,
) -> ApiResult {
    let tenant = existing_tenant(&app, raw).await?;
    let missing = || ApiError::not_found(format!("replay {id} does not exist"));
    let replay_id: Uuid = id.parse().map_err(|_| missing())?;
    let replay = app
        .engine
        .replay_progress(&tenant, replay_id)
        .await?
        .ok_or_else(missing)?;
    Ok(Json(replay).into_response())
}
