//! The API's one error shape, and the one place where the errors of the layers below become
//! status codes: `{"error": {"code": "...", "message": "..."}}` with its status.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sheaf_store::ErrorKind;

use sheaf_engine::PublishError;

/// The `Retry-After` of a 503 `unavailable`: long enough for a reconnect, a failover or
/// retention's next pass to free space, short enough that a client does not wait long past it.
pub const UNAVAILABLE_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// An error answered to an API client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable, machine-readable code (`not_found`, `invalid_request`, ...).
    pub code: &'static str,
    /// What went wrong, for a person.
    pub message: String,
    /// Sent as `Retry-After` (whole seconds, at least 1) when set: a refusal the client should
    /// retry after that long.
    pub retry_after: Option<std::time::Duration>,
}

impl ApiError {
    /// An error with the given status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 503 `overloaded` with `Retry-After`: the service takes no more work until what it has
    /// accepted drains; the client should retry after `retry_after`.
    pub fn overloaded(message: impl Into<String>, retry_after: std::time::Duration) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message)
        }
    }

    /// 400 `invalid_request`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 404 for a tenant that does not exist.
    pub fn unknown_tenant(tenant: &str) -> Self {
        Self::not_found(format!("tenant {tenant:?} does not exist"))
    }

    /// 503 `unavailable` with `Retry-After` ([`UNAVAILABLE_RETRY_AFTER`]): a store cannot take
    /// the request now (unreachable, a full disk, a file at its size limit); the client should
    /// retry, and nothing it had accepted before is lost.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            retry_after: Some(UNAVAILABLE_RETRY_AFTER),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        }
    }

    /// 500 `internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl From<sheaf_store::Error> for ApiError {
    fn from(err: sheaf_store::Error) -> Self {
        match err.kind() {
            ErrorKind::NotFound => Self::not_found(err.to_string()),
            ErrorKind::Conflict => Self::new(StatusCode::CONFLICT, "conflict", err.to_string()),
            ErrorKind::InvalidInput => Self::invalid(err.to_string()),
            ErrorKind::Unavailable => Self::unavailable(err.to_string()),
            _ => {
                tracing::error!(error = %err, "store error");
                Self::internal(err.to_string())
            }
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": { "code": self.code, "message": self.message }
        });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(after) = self.retry_after {
            let seconds = after.as_secs_f64().ceil().max(1.0) as u64;
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        response
    }
}

impl From<PublishError> for ApiError {
    fn from(err: PublishError) -> Self {
        match err {
            PublishError::UnknownTenant(tenant) => Self::unknown_tenant(&tenant),
            PublishError::NotFound(message) => Self::not_found(message),
            PublishError::Unavailable(message) => Self::unavailable(message),
            PublishError::Store(err) => Self::from(err),
            PublishError::Overloaded {
                message,
                retry_after,
            } => Self::overloaded(message, retry_after),
            PublishError::Internal(message) => Self::internal(message),
            // A kind added to the engine after this mapping: a 500 that still says what it was.
            other => Self::internal(other.to_string()),
        }
    }
}
