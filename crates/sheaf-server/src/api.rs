//! The HTTP API: the route table, the router built from it, authentication and extractors.
//!
//! [`routes`] is the single list of what the service serves. The router and the OpenAPI
//! document ([`crate::openapi`]) are both built from it, so the document cannot miss a route.
//! Every error, including axum's own rejections (bad JSON, oversized bodies, unknown routes,
//! wrong methods), is answered in the API's one shape (see [`ApiError`]).
//!
//! Each route says who may call it ([`Access`]); one middleware, built from that, checks the
//! caller before any handler runs: the admin key (`SHEAF_API_KEY`, compared in constant time) or
//! a tenant token (`crate::tokens`, its signature checked in constant time), and for a token,
//! that the route is open to tokens and names the token's tenant. A tenant token that names
//! another tenant gets `403` whether or not that tenant exists, so a token learns nothing about
//! other tenants.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{
    DefaultBodyLimit, FromRequest, FromRequestParts, RawPathParams, Request, State,
};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use serde::de::DeserializeOwned;
use sha2::{Digest as _, Sha256};
use sheaf_store::TenantId;
use subtle::ConstantTimeEq as _;

use crate::body::BodyError;
use crate::core::Core;
use crate::error::ApiError;
use crate::handlers;
use crate::tokens::{looks_like_token, unix_now};

/// The state every handler gets.
pub type AppState = Arc<Core>;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: health, readiness, metrics and the OpenAPI document.
    Open,
    /// The admin key only; a tenant token gets `403`.
    Admin,
    /// The admin key, or a token of the tenant the path's `{tenant_id}` names.
    TenantPath,
    /// The admin key, or a token of the tenant the body's `tenant_id` names: the handler checks
    /// it with [`Caller::may_act_for`] before it looks the tenant up (publish).
    TenantBody,
}

/// Who is calling, once authenticated; the middleware puts it in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The admin key, or any caller while the admin API is open (no `SHEAF_API_KEY`).
    Admin,
    /// A valid tenant token.
    Tenant(TenantId),
}

impl Principal {
    /// `Ok` when this caller may act for `tenant`; `403 forbidden` otherwise.
    pub fn may_act_for(&self, tenant: &TenantId) -> Result<(), ApiError> {
        match self {
            Principal::Admin => Ok(()),
            Principal::Tenant(own) if own == tenant => Ok(()),
            Principal::Tenant(own) => Err(forbidden(format!(
                "this token is for tenant {own:?} and cannot act for another tenant"
            ))),
        }
    }
}

fn forbidden(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
}

/// The authenticated caller, for handlers of [`Access::TenantBody`] routes. A request that did
/// not pass the middleware (which cannot happen on a protected route) counts as unauthenticated.
#[derive(Debug)]
pub struct Caller(pub Principal);

impl Caller {
    /// See [`Principal::may_act_for`].
    pub fn may_act_for(&self, tenant: &TenantId) -> Result<(), ApiError> {
        self.0.may_act_for(tenant)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Response> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .map(Caller)
            .ok_or_else(|| unauthorized("no credentials were checked for this request"))
    }
}

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
    /// Who may call it.
    pub access: Access,
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
const E401: (u16, &str, Option<&str>) = (
    401,
    "Missing or wrong admin key, or an invalid or expired tenant token",
    Some("Error"),
);
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
            access: Access::Open,
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
            access: Access::Open,
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
            access: Access::Open,
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
            access: Access::Open,
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
            access: Access::Admin,
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
            access: Access::TenantPath,
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
            access: Access::Admin,
            query: &[],
            request: None,
            responses: &[(204, "Deleted", None), E401, E404],
            handler: |m| on(m, handlers::delete_tenant),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/tenants/{tenant_id}/tokens",
            operation_id: "issueTenantToken",
            summary: "Issue a signed, expiring API token that reaches only this tenant (admin key only; needs SHEAF_TOKEN_SIGNING_KEY).",
            tag: "tenants",
            access: Access::Admin,
            query: &[],
            request: Some("TokenInput"),
            responses: &[(201, "Issued", Some("TenantToken")), E400, E401, E404, E413],
            handler: |m| on(m, handlers::issue_token),
        },
        Route {
            method: Method::POST,
            path: "/api/v1/tenants/{tenant_id}/destinations",
            operation_id: "createDestination",
            summary: "Create a destination; the answer holds its signing secret.",
            tag: "destinations",
            access: Access::TenantPath,
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
            access: Access::TenantPath,
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
            access: Access::TenantPath,
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
            access: Access::TenantPath,
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
            access: Access::TenantPath,
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
            access: Access::TenantPath,
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
            access: Access::TenantPath,
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
            access: Access::TenantPath,
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
            access: Access::TenantBody,
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
            access: Access::TenantPath,
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
            access: Access::TenantPath,
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
            access: Access::TenantPath,
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
            access: Access::TenantPath,
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
            access: Access::TenantPath,
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
            access: Access::TenantPath,
            query: &[],
            request: Some("RetryInput"),
            responses: &[(202, "Queued", Some("RetryQueued")), E400, E401, E404, E413],
            handler: |m| on(m, handlers::retry),
        },
    ]
}

/// Builds the router from [`routes`]: each protected route gets the authorization middleware
/// with its own [`Access`].
pub fn router(core: AppState) -> Router {
    let mut router: Router<AppState> = Router::new();
    for route in routes() {
        let filter = MethodFilter::try_from(route.method.clone())
            .expect("the route table uses standard methods");
        let mut method_router = (route.handler)(filter);
        if route.access != Access::Open {
            method_router = method_router.route_layer(axum::middleware::from_fn_with_state(
                (Arc::clone(&core), route.access),
                authorize,
            ));
        }
        router = router.route(route.path, method_router);
    }
    let max_body = core.config.max_body_bytes;
    router
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

/// The bearer value of an `Authorization` header (the scheme is case-insensitive, RFC 7235).
fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(rest.trim())
}

/// Who presented what: the admin key, a valid tenant token, or why the answer is `401`.
fn authenticate(core: &Core, headers: &axum::http::HeaderMap) -> Result<Principal, String> {
    let Some(admin) = core.config.api_key.as_ref() else {
        // No SHEAF_API_KEY: the admin API is open (loopback only, see config.rs).
        return Ok(Principal::Admin);
    };
    let Some(presented) = bearer(headers) else {
        return Err(
            "credentials are required: Authorization: Bearer <SHEAF_API_KEY or a tenant token>"
                .to_owned(),
        );
    };
    // The admin key is compared first, and always, so timing does not tell a token-shaped
    // value from a wrong key.
    if key_matches(presented, admin.expose()) {
        return Ok(Principal::Admin);
    }
    if !looks_like_token(presented) {
        return Err("the admin key is wrong".to_owned());
    }
    let Some(key) = core.config.token_signing_key.as_ref() else {
        return Err(
            "tenant tokens are not enabled on this server (SHEAF_TOKEN_SIGNING_KEY is not set)"
                .to_owned(),
        );
    };
    key.verify(presented, unix_now())
        .map(|claims| Principal::Tenant(claims.tenant))
        .map_err(|refused| refused.0)
}

/// The middleware of every protected route: authenticates, then checks the caller against the
/// route's [`Access`], then hands the [`Principal`] to the handler.
async fn authorize(
    State((core, access)): State<(AppState, Access)>,
    request: Request,
    next: Next,
) -> Response {
    let principal = match authenticate(&core, request.headers()) {
        Ok(principal) => principal,
        Err(why) => return unauthorized(&why),
    };
    let (mut parts, body) = request.into_parts();
    if let Principal::Tenant(own) = &principal {
        match access {
            Access::Open | Access::TenantBody => {}
            Access::Admin => {
                return forbidden("this route needs the admin key; a tenant token cannot use it")
                    .into_response();
            }
            Access::TenantPath => {
                // The raw (percent-decoded) path parameter, compared byte for byte: a value that
                // is not the token's tenant id exactly, valid or not, is another tenant.
                let named = RawPathParams::from_request_parts(&mut parts, &())
                    .await
                    .ok()
                    .and_then(|params| {
                        params
                            .iter()
                            .find(|(name, _)| *name == "tenant_id")
                            .map(|(_, value)| value == own.as_str())
                    });
                if named != Some(true) {
                    return forbidden(format!(
                        "this token is for tenant {own:?} and cannot act for another tenant"
                    ))
                    .into_response();
                }
            }
        }
    }
    parts.extensions.insert(principal);
    next.run(Request::from_parts(parts, body)).await
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
        crate::body::parse_json(&bytes)
            .map(ApiJson)
            .map_err(ApiError::from)
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
        crate::body::parse_json(&bytes)
            .map(|v| OptionalJson(Some(v)))
            .map_err(ApiError::from)
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

impl From<BodyError> for ApiError {
    fn from(err: BodyError) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, err.code, err.message)
    }
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
