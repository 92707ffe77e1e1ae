//! Extractors that answer in the API's one error shape: JSON bodies (413 over the body limit,
//! 400 for malformed JSON or the wrong shape), path and query parameters.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::http::error::ApiError;
use crate::settings::Config;
use sheaf_engine::body::{BodyError, parse_json};

/// What every handler works with: the engine's handle and the service's configuration.
#[derive(Debug)]
pub struct App {
    /// The engine, through its façade only.
    pub engine: sheaf_engine::Engine,
    /// The settings the service runs with (the engine's are in `config.engine` too).
    pub config: Config,
}

/// The state every handler gets.
pub type AppState = Arc<App>;

/// Declares a body extractor: the body's bytes (413 over the body limit) turned into `Self`
/// by `$parse`, with the API's errors.
macro_rules! body_extractor {
    ($(#[$doc:meta])* $name:ident($field:ty), $parse:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name<T>(pub $field);

        impl<S, T> FromRequest<S> for $name<T>
        where
            S: Send + Sync,
            T: DeserializeOwned,
        {
            type Rejection = ApiError;

            async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
                let bytes = read_body(request, state).await?;
                $parse(&bytes).map($name).map_err(ApiError::from)
            }
        }
    };
}

body_extractor!(
    /// A JSON body, read whatever its content type says: 400 for malformed JSON or a body of the
    /// wrong shape.
    ApiJson(T),
    parse_json
);

body_extractor!(
    /// A JSON body that may be absent (an empty body).
    OptionalJson(Option<T>),
    |bytes: &Bytes| -> Result<Option<T>, BodyError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            Ok(None)
        } else {
            parse_json(bytes).map(Some)
        }
    }
);

/// Declares a request-parts extractor over axum's own, its rejection answered as a 400 that
/// names the part of the request.
macro_rules! parts_extractor {
    ($(#[$doc:meta])* $name:ident, $inner:ident, $part:literal) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name<T>(pub T);

        impl<S, T> FromRequestParts<S> for $name<T>
        where
            S: Send + Sync,
            T: DeserializeOwned + Send,
        {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
                axum::extract::$inner::<T>::from_request_parts(parts, state)
                    .await
                    .map(|axum::extract::$inner(v)| $name(v))
                    .map_err(|e| ApiError::invalid(format!("{}: {}", $part, e.body_text())))
            }
        }
    };
}

parts_extractor!(
    /// Path parameters with the API's errors.
    ApiPath,
    Path,
    "path"
);

parts_extractor!(
    /// Query parameters with the API's errors.
    ApiQuery,
    Query,
    "query"
);

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

/// A place among the publishes handled at once (`SHEAF_MAX_PUBLISHES_IN_FLIGHT`), held until the
/// handler returns; `503 overloaded` with `Retry-After` when every place is taken. Put it before
/// the body extractor so a refused publish is not read.
#[derive(Debug)]
pub struct PublishPlace(#[allow(dead_code)] sheaf_engine::admission::InFlight);

impl FromRequestParts<AppState> for PublishPlace {
    type Rejection = ApiError;

    async fn from_request_parts(_parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        app.engine
            .admit()
            .map(PublishPlace)
            .map_err(|refused| ApiError::overloaded(refused.message, refused.retry_after))
    }
}
