//! Health, readiness, metrics and the OpenAPI document.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::http::error::ApiError;
use crate::http::extract::AppState;
use sheaf_engine::metrics::CdcState;

use super::ApiResult;

pub(crate) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// A store that did not answer its ping makes the process not ready.
fn check(what: &str, result: sheaf_store::Result<()>) -> Result<(), ApiError> {
    result.map_err(|err| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            format!("the {what} is not reachable: {err}"),
        )
    })
}

pub(crate) async fn readyz(State(app): State<AppState>) -> ApiResult {
    let ready = app.engine.readiness().await;
    let log_down = match ready.log {
        Err(err) if ready.log_behind_outbox => Some(err.to_string()),
        log => {
            check("log store", log)?;
            None
        }
    };
    check("queue", ready.queue)?;
    check("entity store", ready.entities)?;
    // The CDC source's state is reported, not required: the API and deliveries work while the
    // application's database is away, and the source catches up from its slot when it is back.
    let cdc = app.engine.cdc();
    let mut body = json!({ "status": "ready" });
    let state = cdc.state();
    if state != CdcState::Disabled {
        body["cdc"] = json!({
            "state": state.as_str(),
            "confirmed_lsn": sheaf_cdc::Lsn(cdc.confirmed_lsn.load(std::sync::atomic::Ordering::Relaxed)).to_string(),
            "last_error": cdc.last_error(),
        });
    }
    if let Some(error) = log_down {
        body["log_store"] = json!({
            "reachable": false,
            "error": error,
            "note": "publishes and deliveries continue; events and attempts wait in the outbox",
        });
    }
    Ok(Json(body).into_response())
}

pub(crate) async fn metrics(State(app): State<AppState>) -> Response {
    let body = app.engine.metrics_page().await;
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// The OpenAPI document, rendered once when the router is built (`super::super::router`).
pub(crate) async fn openapi(Extension(document): Extension<Arc<Value>>) -> Json<Value> {
    Json(Value::clone(&document))
}
