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
use crate::state::metrics::CdcState;

use super::ApiResult;

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
    // With a shipped outbox, publishes and deliveries do not need the log store: its outage is
    // reported (searches fail, the outbox grows), not a reason to take the process out.
    let shipped = stores.outbox.as_ref().is_some_and(|o| !o.is_log());
    let log_down = match log {
        Err(err) if shipped => Some(err.to_string()),
        log => {
            check("log store", log)?;
            None
        }
    };
    check("queue", queue)?;
    check("entity store", entities)?;
    // The CDC source's state is reported, not required: the API and deliveries work while the
    // application's database is away, and the source catches up from its slot when it is back.
    let cdc = &core.metrics.cdc;
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

pub(crate) async fn metrics(State(core): State<AppState>) -> Response {
    let depth = core.stores.queue.depth().await.ok();
    let backlog = match &core.stores.outbox {
        Some(outbox) if !outbox.is_log() => outbox.backlog().await.ok(),
        _ => None,
    };
    let body = crate::state::metrics::render(&core.metric_sources, depth, backlog);
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
