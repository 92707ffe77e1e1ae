//! Bulk replays: start one, read its progress.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use uuid::Uuid;

use crate::http::error::ApiError;
use crate::http::extract::{ApiJson, ApiPath, AppState};
use crate::ingest::replay::{ReplayRequest, start_replay};

use super::{ApiResult, existing_tenant, tenant_id};

pub(crate) async fn replay(
    State(core): State<AppState>,
    ApiPath(raw): ApiPath<String>,
    ApiJson(request): ApiJson<ReplayRequest>,
) -> ApiResult {
    let tenant = tenant_id(raw)?;
    let progress = start_replay(&core, &tenant, request).await?;
    Ok((StatusCode::ACCEPTED, Json(progress)).into_response())
}

pub(crate) async fn get_replay(
    State(core): State<AppState>,
    ApiPath((raw, id)): ApiPath<(String, String)>,
) -> ApiResult {
    let tenant = existing_tenant(&core, raw).await?;
    let missing = || ApiError::not_found(format!("replay {id} does not exist in this process"));
    let replay_id: Uuid = id.parse().map_err(|_| missing())?;
    let progress = core
        .replays
        .get(&tenant, replay_id)
        .await
        .ok_or_else(missing)?;
    Ok(Json(progress).into_response())
}
