//! The HTTP API under `/api/v1`, plus `/healthz`, `/readyz`, `/metrics` and the OpenAPI
//! document: the top layer of the crate, and the only one that speaks HTTP status codes.
//!
//! - [`mod@routes`]: the route table, each route with its [`auth::Access`]; the router below and the
//!   OpenAPI document (`openapi`) are both built from it.
//! - [`auth`]: the admin key and tenant tokens (`tokens`), checked by one middleware.
//! - `extract`: request extractors that answer in the API's error shape.
//! - `handlers`: one file per resource.
//! - `error`: the one error shape, and the mapping of every lower layer's error to a status.
//! - `limits`: bounds on what a destination may carry.
//! - `layers`: what every request goes through first: its request id, its span, its timeout.
//! - `portal`: the web portal's embedded files under `/portal/`, outside the route table (they
//!   are not API), with their Content-Security-Policy.
//!
//! Every error, including axum's own rejections (bad JSON, oversized bodies, unknown routes,
//! wrong methods), is answered in that one shape.

// Public for the tests only: the route table and who may call each route.
pub mod auth;
mod error;
pub(crate) mod extract;
mod handlers;
mod layers;
mod limits;
mod openapi;
mod portal;
pub mod routes;
mod tokens;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::MethodFilter;
use axum::{Extension, Router};

use auth::{Access, authorize};
use error::ApiError;
use extract::AppState;
use routes::routes;

/// Builds the router from [`routes()`]: each protected route gets the authorization middleware
/// with its own [`Access`].
pub fn router(app: AppState) -> Router {
    let mut router: Router<AppState> = Router::new();
    for route in routes() {
        let filter = MethodFilter::try_from(route.method.clone())
            .expect("the route table uses standard methods");
        let mut method_router = (route.handler)(filter);
        if route.access != Access::Open {
            method_router = method_router.route_layer(axum::middleware::from_fn_with_state(
                (Arc::clone(&app), route.access),
                authorize,
            ));
        }
        router = router.route(route.path, method_router);
    }
    let max_body = app.config.max_body_bytes;
    // The document depends on the configuration only, which does not change while running.
    let document = Arc::new(openapi::document(
        &app.config,
        app.engine.destination_types(),
    ));
    let timeout = app.config.request_timeout;
    let traced = app.engine.traced();
    let router = router
        .merge(portal::routes())
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(Extension(document));
    layers::wrap(router, timeout, traced).with_state(app)
}

async fn route_not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "route_not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not accept that method",
    )
}
