//! The web portal under `/portal/`: static files embedded in the binary at build time (see
//! `build.rs`), served with a Content-Security-Policy that lets the page load only its own
//! scripts and styles and talk only to this server.
//!
//! The portal holds no secret of its own and needs none: everything it shows comes from the
//! public API, called with the tenant token of a portal link
//! (`POST /api/v1/tenants/{tenant_id}/portal`) or the admin key typed into it, kept in the
//! page's memory only. So its files are open to anyone, like the OpenAPI document.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use crate::http::error::ApiError;
use crate::http::extract::AppState;

/// Every portal file: its path under `/portal/` and its bytes.
const ASSETS: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/portal_assets.rs"));

/// Only this server's own scripts, styles and API; no inline code, no frames, no forms posting
/// elsewhere. `img-src data:` is for the icons the stylesheet inlines.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The portal's routes, merged into the API's router.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/portal", get(|| async { Redirect::permanent("/portal/") }))
        .route("/portal/", get(|| async { asset("index.html") }))
        .route(
            "/portal/{*file}",
            get(|Path(file): Path<String>| async move { asset(&file) }),
        )
}

fn content_type(file: &str) -> &'static str {
    match file.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

fn asset(file: &str) -> Response {
    let Some((_, bytes)) = ASSETS.iter().find(|(name, _)| *name == file) else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "route_not_found",
            format!("the portal has no file {file:?}"),
        )
        .into_response();
    };
    let mut response = (StatusCode::OK, *bytes).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(file)),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // A portal link's token is in the fragment, which no Referer carries; this keeps even the
    // path to itself.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Small files, and a new binary may bring new ones: always revalidate.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_portal_is_embedded_without_its_tests() {
        let names: Vec<&str> = ASSETS.iter().map(|(name, _)| *name).collect();
        assert!(names.contains(&"index.html"), "{names:?}");
        assert!(
            names
                .iter()
                .all(|n| !n.starts_with("test/") && !n.contains("node_modules")),
            "{names:?}"
        );
        for name in names {
            assert_ne!(
                content_type(name),
                "application/octet-stream",
                "{name}: a file type the portal does not serve"
            );
        }
    }
}
