//! The HTTP API: the route table, the router built from it, authentication and extractors.
//!
//! [`routes`] is the single list of what the service serves. The router and the OpenAPI
//! document ([`crate::openapi`]) are both built from it, so the document cannot miss a route.
//! Every error, including axum's own rejections (bad JSON, oversized bodies, unknown routes,
//! wrong methods), is answered in the API's one shape (see [`ApiError`]).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use serde::de::DeserializeOwned;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use crate::core::Core;
use crate::error::ApiError;
use crate::handlers;
use crate::publish::bad_body;

/// The state every handler gets.
pub type AppState = Arc<Core>;

/// One route: what the router serves and what the OpenAPI document says about it.
#[derive(Debug, Clone)]
pub struct Route {
    /// The HTTP method.
    pub method: Method,
    /// The path, with `{name}` parameters (axum and OpenAPI share the syntax).
    pub path: &'static str,
    /// The OpenAPI `operationId`.
    pub operation_id: &'static str,
    /// One line for the document.
    pub summary: &'static str,
    /// The document's grouping.
    pub tag: &'static str,
    /// Whether the admin key is required.
    pub auth: bool,
    /// Query parameters: name, schema type, description.
    pub query: &'static [(&'static str, &'static str, &'static str)],
    /// The request body's schema name in `components.schemas`, if it takes one.
    pub request: Option<&'static str>,
    /// Answers: status, description, schema name (`None`: no body or plain text).
    pub responses: &'static [(u16, &'static str, Option<&'static str>)],
    /// Builds the method router for this route's method.
    pub handler: fn(MethodFilter) -> MethodRouter<AppState>,
}

const LIST_QUERY: [(&str, &str, &str); 2] = [
    (
        "limit",
        "integer",
        "Items per page, 1 to 1000 (default 100).",
    ),
    ("next", "string", "The `next` cursor of the previous page."),
];

const E400: (u16, &str, Option<&str>) = (400, "Invalid request", Some("Error"));
const E401: (u16, &str, Option<&str>) = (401, "Missing or wrong admin key", Some("Error"));
const E404: (u16, &str, Option<&str>) = (404, "Unknown tenant or resource", Some("Error"));
const E413: (u16, &str, Option<&str>) =
    (413, "Body larger than SHEAF_MAX_BODY_BYTES", Some("Error"));
const E503: (u16, &str, Option<&str>) = (503, "A store is unavailable; retry", Some("Error"));

/// Every route the service serves.
pub fn routes() -> Vec<Route> {
    vec![
        Route {
            method: Method::GET,
            path: "/healthz",
            operation_id: "healthz",
            summary: "Liveness: the process answers.",
            tag: "operations",
            auth: false,
            query: &[],
            request: None,
            responses: &[(200, "Alive", Some("Status"))],
            handler: |m| on(m, handlers::healthz),
        },
        Route {
            method: Method::GET,
            path: "/readyz",
            operation_id: "readyz",
            summary: "Readiness: every store answers its ping.",
            tag: "operations",
            auth: false,
            query: &[],
            request: None,
            responses: &[
                (200, "Ready", Some("Status")),
                (503, "A store is unreachable", Some("Error")),
            ],
            handler: |m| on(m, handlers::readyz),
        },
        Route {
            method: Method::GET,
            path: "/metrics",
            operation_id: "metrics",
            summary: "Prometheus metrics (text format 0.0.4).",
            tag: "operations",
            auth: false,
            query: &[],
            request: None,
            responses: &[(200, "Metrics in the Prometheus text format", None)],
            handler: |m| on(m, handlers::metrics),
        },
        Route {
            method: Method::GET,
            path: "/api/v1/openapi.json",
            operation_id: "openapi",
            summary: "This document.",
            tag: "operations",
            auth: false,
            query: &[],
            request: None,
            responses: &[(200, "The OpenAPI 3.1 document", None)],
            handler: |m| on(m, handlers::openapi),
        },
        Route {
            method: Method::PUT,
            path: "/api/v1/tenants/{tenant_id}",
            operation_id: "upsertTenant",
            summary: "Create a tenant, or replace its metadata.",
            tag: "tenants",
            auth: true,
            query: &[],
            request: Some("TenantInput"),
            responses: &[
                (200, "Updated", Some("Tenant")),
                (201, "Created", Some("Tenant")),
                E400,
                E401,
                E413,
            ],
            handler: |m| on(m, handlers::put_tenant),
        },
        Route {
            method: Method::GET,
            path: "/api/v1/tenants/{tenant_id}",
            operation_id: "getTenant",
            summary: "Get a tenant.",
            tag: "tenants",
            auth: true,
            query: &[],
            request: None,
            responses: &[(200, "The tenant", Some("Tenant")), E401, E404],
            handler: |m| on(m, handlers::get_tenant),
        },
        Route {
            method: Method::DELETE,
            path: "/api/v1/tenants/{tenant_id}",
            operation_id: "deleteTenant",
            summary: "Delete a tenant, its destinations and its pending deliveries.",
            tag: "tenants",
            auth: true,
            query: &[],
            request: None,
            responses: &[(204, "Deleted", None), E401, E404],
            handler: |m| on(m, handlers::delete_tenant),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/tenants/{tenant_id}/destinations",
            operation_id: "createDestination",
            summary: "Create a destination; the answer holds its signing secret.",
            tag: "destinations",
            auth: true,
            query: &[],
            request: Some("DestinationInput"),
            responses: &[
                (201, "Created", Some("Destination")),
                E400,
                E401,
                E404,
                E413,
            ],
            handler: |m| on(m, handlers::create_destination),
        },
        Route {
            method: Method::GET,
            path: "/api/v1/tenants/{tenant_id}/destinations",
            operation_id: "listDestinations",
            summary: "List a tenant's destinations, oldest first.",
            tag: "destinations",
            auth: true,
            query: &[],
            request: None,
            responses: &[
                (200, "The destinations", Some("DestinationList")),
                E401,
                E404,
            ],
            handler: |m| on(m, handlers::list_destinations),
        },
        Route {
            method: Method::GET,
            path: "/api/v1/tenants/{tenant_id}/destinations/{destination_id}",
            operation_id: "getDestination",
            summary: "Get a destination.",
            tag: "destinations",
            auth: true,
            query: &[],
            request: None,
            responses: &[(200, "The destination", Some("Destination")), E401, E404],
            handler: |m| on(m, handlers::get_destination),
        },
        Route {
            method: Method::PATCH,
            path: "/api/v1/tenants/{tenant_id}/destinations/{destination_id}",
            operation_id: "updateDestination",
            summary: "Change a destination's URL, topics, headers or enabled flag.",
            tag: "destinations",
            auth: true,
            query: &[],
            request: Some("DestinationPatch"),
            responses: &[
                (200, "Updated", Some("Destination")),
                E400,
                E401,
                E404,
                E413,
            ],
            handler: |m| on(m, handlers::patch_destination),
        },
        Route {
            method: Method::DELETE,
            path: "/api/v1/tenants/{tenant_id}/destinations/{destination_id}",
            operation_id: "deleteDestination",
            summary: "Delete a destination; its pending deliveries are dropped.",
            tag: "destinations",
            auth: true,
            query: &[],
            request: None,
            responses: &[(204, "Deleted", None), E401, E404],
            handler: |m| on(m, handlers::delete_destination),
        },
        Route {
            method: Method::PUT,
            path: "/api/v1/tenants/{tenant_id}/destinations/{destination_id}/enable",
            operation_id: "enableDestination",
            summary: "Enable a destination.",
            tag: "destinations",
            auth: true,
            query: &[],
            request: None,
            responses: &[(200, "Enabled", Some("Destination")), E401, E404],
            handler: |m| on(m, handlers::enable_destination),
        },
        Route {
            method: Method::PUT,
            path: "/api/v1/tenants/{tenant_id}/destinations/{destination_id}/disable",
            operation_id: "disableDestination",
            summary: "Disable a destination: it receives nothing; its pending deliveries are dead-lettered.",
            tag: "destinations",
            auth: true,
            query: &[],
            request: None,
            responses: &[(200, "Disabled", Some("Destination")), E401, E404],
            handler: |m| on(m, handlers::disable_destination),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/tenants/{tenant_id}/destinations/{destination_id}/rotate-secret",
            operation_id: "rotateSecret",
            summary: "Replace the signing secret; the previous one keeps signing for SHEAF_SECRET_ROTATION_GRACE.",
            tag: "destinations",
            auth: true,
            query: &[],
            request: None,
            responses: &[(200, "Rotated", Some("Destination")), E401, E404],
            handler: |m| on(m, handlers::rotate_secret),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/publish",
            operation_id: "publish",
            summary: "Publish an event; 202 once it is recorded and its deliveries are queued.",
            tag: "events",
            auth: true,
            query: &[],
            request: Some("PublishInput"),
            responses: &[
                (202, "Accepted", Some("Published")),
                E400,
                E401,
                E404,
                E413,
                E503,
            ],
            handler: |m| on(m, handlers::publish),
        },
        Route {
            method: Method::GET,
            path: "/api/v1/tenants/{tenant_id}/events",
            operation_id: "listEvents",
            summary: "List a tenant's events, newest first.",
            tag: "events",
            auth: true,
            query: &[
                ("topic", "string", "Only events with this topic."),
                LIST_QUERY[0],
                LIST_QUERY[1],
            ],
            request: None,
            responses: &[
                (200, "A page of events", Some("EventPage")),
                E400,
                E401,
                E404,
            ],
            handler: |m| on(m, handlers::list_events),
        },
        Route {
            method: Method::GET,
            path: "/api/v1/tenants/{tenant_id}/events/{event_id}",
            operation_id: "getEvent",
            summary: "Get an event with its data.",
            tag: "events",
            auth: true,
            query: &[],
            request: None,
            responses: &[(200, "The event", Some("Event")), E401, E404],
            handler: |m| on(m, handlers::get_event),
        },
        Route {
            method: Method::GET,
            path: "/api/v1/tenants/{tenant_id}/attempts",
            operation_id: "listAttempts",
            summary: "List delivery attempts, newest first.",
            tag: "attempts",
            auth: true,
            query: &[
                ("event_id", "string", "Only attempts of this event."),
                (
                    "destination_id",
                    "string",
                    "Only attempts to this destination.",
                ),
                ("status", "string", "`success` or `failed`."),
                (
                    "topic",
                    "string",
                    "Only attempts of events with this topic.",
                ),
                LIST_QUERY[0],
                LIST_QUERY[1],
            ],
            request: None,
            responses: &[
                (200, "A page of attempts", Some("AttemptPage")),
                E400,
                E401,
                E404,
            ],
            handler: |m| on(m, handlers::list_attempts),
        },
        Route {
            method: Method::GET,
            path: "/api/v1/tenants/{tenant_id}/attempts/{attempt_id}",
            operation_id: "getAttempt",
            summary: "Get one attempt.",
            tag: "attempts",
            auth: true,
            query: &[],
            request: None,
            responses: &[(200, "The attempt", Some("Attempt")), E400, E401, E404],
            handler: |m| on(m, handlers::get_attempt),
        },
        Route {
            method: Method::GET,
            path: "/api/v1/tenants/{tenant_id}/dead-letters",
            operation_id: "listDeadLetters",
            summary: "List deliveries given up on (past SHEAF_RETRY_MAX_ATTEMPTS, or to a disabled destination), newest first.",
            tag: "attempts",
            auth: true,
            query: &LIST_QUERY,
            request: None,
            responses: &[
                (200, "A page of dead letters", Some("DeadLetterPage")),
                E400,
                E401,
                E404,
            ],
            handler: |m| on(m, handlers::list_dead_letters),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/tenants/{tenant_id}/retry",
            operation_id: "retry",
            summary: "Deliver an event to a destination again now; supersedes a pending automatic retry.",
            tag: "attempts",
            auth: true,
            query: &[],
            request: Some("RetryInput"),
            responses: &[(202, "Queued", Some("RetryQueued")), E400, E401, E404, E413],
            handler: |m| on(m, handlers::retry),
        },
    ]
}

/// Builds the router from [`routes`].
pub fn router(core: AppState) -> Router {
    let mut admin: Router<AppState> = Router::new();
    let mut open: Router<AppState> = Router::new();
    for route in routes() {
        let filter = MethodFilter::try_from(route.method.clone())
            .expect("the route table uses standard methods");
        let method_router = (route.handler)(filter);
        if route.auth {
            admin = admin.route(route.path, method_router);
        } else {
            open = open.route(route.path, method_router);
        }
    }
    let admin = admin.route_layer(axum::middleware::from_fn_with_state(
        Arc::clone(&core),
        require_admin_key,
    ));
    let max_body = core.config.max_body_bytes;
    open.merge(admin)
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(core)
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

/// Constant-time comparison of the presented bearer token with the configured key. Both are
/// hashed first so the comparison does not even leak the key's length.
fn key_matches(presented: &str, expected: &str) -> bool {
    let a = Sha256::digest(presented.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.ct_eq(&b).into()
}

async fn require_admin_key(State(core): State<AppState>, request: Request, next: Next) -> Response {
    let Some(expected) = core.config.api_key.as_deref() else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(token) if key_matches(token, expected) => next.run(request).await,
        Some(_) => unauthorized("the admin key is wrong"),
        None => unauthorized("an admin key is required: Authorization: Bearer <SHEAF_API_KEY>"),
    }
}

fn unauthorized(message: &str) -> Response {
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// A JSON body, read whatever its content type says, with the API's errors: 413 over the
/// body limit, 400 for malformed JSON or a body of the wrong shape.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = read_body(request, state).await?;
        serde_json::from_slice(&bytes)
            .map(ApiJson)
            .map_err(|e| bad_body(&e))
    }
}

/// A JSON body that may be absent (an empty body).
#[derive(Debug)]
pub struct OptionalJson<T>(pub Option<T>);

impl<S, T> FromRequest<S> for OptionalJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = read_body(request, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(None));
        }
        serde_json::from_slice(&bytes)
            .map(|v| OptionalJson(Some(v)))
            .map_err(|e| bad_body(&e))
    }
}

async fn read_body<S: Send + Sync>(request: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(request, state)
        .await
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "the request body is larger than SHEAF_MAX_BODY_BYTES allows",
                )
            } else {
                ApiError::invalid(format!(
                    "could not read the request body: {}",
                    rejection.body_text()
                ))
            }
        })
}

/// Path parameters with the API's errors.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(v)| ApiPath(v))
            .map_err(|e| ApiError::invalid(format!("path: {}", e.body_text())))
    }
}

/// Query parameters with the API's errors.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(v)| ApiQuery(v))
            .map_err(|e| ApiError::invalid(format!("query: {}", e.body_text())))
    }
}
