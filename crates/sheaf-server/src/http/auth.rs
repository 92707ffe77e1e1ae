//! Who may call what. Each route says who may call it ([`Access`]); one middleware
//! (`authorize`), built from that, checks the caller before any handler runs: the admin key
//! (`SHEAF_API_KEY`, compared in constant time) or a tenant token (`super::tokens`, its
//! signature checked in constant time), and for a token, that the route is open to tokens and
//! names the token's tenant. A tenant token that names another tenant gets `403` whether or
//! not that tenant exists, so a token learns nothing about other tenants.

use axum::extract::{FromRequestParts, RawPathParams, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest as _, Sha256};
use sheaf_store::TenantId;
use subtle::ConstantTimeEq as _;

use crate::http::error::ApiError;
use crate::http::extract::App;
use crate::http::extract::AppState;
use crate::http::tokens::{looks_like_token, unix_now};

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
fn authenticate(app: &App, headers: &axum::http::HeaderMap) -> Result<Principal, String> {
    let Some(admin) = app.config.api_key.as_ref() else {
        // No SHEAF_API_KEY: the admin API is open (loopback only, see `settings::check_admin_access`).
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
    let Some(key) = app.config.token_signing_key.as_ref() else {
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
pub(crate) async fn authorize(
    State((app, access)): State<(AppState, Access)>,
    request: Request,
    next: Next,
) -> Response {
    let principal = match authenticate(&app, request.headers()) {
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
