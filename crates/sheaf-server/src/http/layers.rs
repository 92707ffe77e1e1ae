//! What every request goes through before its route: a request id, a span, and a timeout, all
//! from tower-http.
//!
//! - **Request id**: `x-request-id` is kept when the client sent one and made up (a UUID)
//!   otherwise, and the response carries it back, whatever its status.
//! - **Span**: one `request` span per request with its method, path and request id, so every
//!   log line written while handling it names the request (`SHEAF_LOG_FORMAT=json` puts them in
//!   the line's `span`). With `SHEAF_OTLP_ENDPOINT` it is exported, continues the trace of the
//!   request's `traceparent`, and carries its `trace_id` and `span_id` for the log lines too. tower-http's own per-request lines are at debug level under the
//!   `tower_http` target; its line per 5xx answer is off, because during a store outage every
//!   publish answers 503 and the outage is already logged once where it is found.
//! - **Timeout** (`SHEAF_REQUEST_TIMEOUT`): a request still unanswered when it expires, reading
//!   its body included, is dropped and answered 503 `request_timeout` in the API's error shape.
//!   A publish dropped after its hand-off to the group commit may still be accepted; the
//!   client's retry with the same id is then a repeat, as after any lost answer.

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::http::error::ApiError;
use sheaf_engine::trace::{continue_from_headers, record_ids};

/// The header that carries the request id, both ways.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Wraps `router` in the layers above, the request id outermost so that every answer, the
/// timeout's included, carries it.
pub fn wrap<S>(router: Router<S>, timeout: Duration, traced: bool) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let span = move |request: &Request<_>| request_span(request, traced);
    router
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            timeout,
        ))
        .layer(axum::middleware::map_response(shape_timeout))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(span)
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

/// The request's span. While spans are exported it continues the trace of the request's
/// `traceparent`, if it has one, and names its trace id for the log lines written in it.
fn request_span<B>(request: &Request<B>, traced: bool) -> tracing::Span {
    let id = request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
        request_id = %id,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
        otel.kind = "server",
    );
    if traced {
        continue_from_headers(&span, request.headers());
        record_ids(&span);
    }
    span
}

/// The timeout layer answers with its status and an empty body; every answer of the API itself
/// has a content type. So a 503 without one is the timeout's, and gets the error shape here.
async fn shape_timeout(response: Response) -> Response {
    if response.status() == StatusCode::SERVICE_UNAVAILABLE
        && !response.headers().contains_key(header::CONTENT_TYPE)
    {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "request_timeout",
            "the request was not answered within SHEAF_REQUEST_TIMEOUT; if it published, \
             publishing again with the same id is safe",
        )
        .into_response();
    }
    response
}
