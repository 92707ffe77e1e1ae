//! The API's handlers, one file per resource: thin translations between JSON and the engine's
//! façade ([`sheaf_engine::Engine`]). The route table
//! (`super::routes`) names them; nothing here names the table.

mod destinations;
mod events;
mod operations;
mod replays;
mod tenants;
mod transforms;

pub(crate) use destinations::*;
pub(crate) use events::*;
pub(crate) use operations::*;
pub(crate) use replays::*;
pub(crate) use tenants::*;
pub(crate) use transforms::*;

use axum::response::Response;
use sheaf_store::{DestinationId, TenantId};

use crate::http::error::ApiError;
use crate::http::extract::App;

pub(super) type ApiResult = Result<Response, ApiError>;

pub(super) fn tenant_id(raw: String) -> Result<TenantId, ApiError> {
    sheaf_engine::body::api_tenant_id(raw).map_err(ApiError::from)
}

/// Refuses writes through the API to the operator tenant (`_sheaf`): Sheaf alone publishes its
/// operator events and keeps its destination; reading them is open to the admin like any tenant.
pub(super) fn not_operator_tenant(tenant: &TenantId) -> Result<(), ApiError> {
    if tenant.as_str() == sheaf_engine::OPERATOR_TENANT {
        return Err(ApiError::invalid(format!(
            "tenant {} is reserved for Sheaf's operator events: it can be read, not written",
            sheaf_engine::OPERATOR_TENANT
        )));
    }
    Ok(())
}

pub(super) fn destination_id(raw: &str) -> Result<DestinationId, ApiError> {
    raw.parse::<DestinationId>()
        .map_err(|_| ApiError::not_found(format!("destination {raw} does not exist")))
}

/// The tenant the path names, 404 unless it exists.
pub(super) async fn existing_tenant(app: &App, raw: String) -> Result<TenantId, ApiError> {
    let tenant = tenant_id(raw)?;
    require_tenant(app, &tenant).await?;
    Ok(tenant)
}

/// The tenant and the destination the path names; 404 unless the tenant exists, or when the
/// destination id is not one.
pub(super) async fn existing_destination(
    app: &App,
    raw: String,
    dest: &str,
) -> Result<(TenantId, DestinationId), ApiError> {
    let tenant = existing_tenant(app, raw).await?;
    Ok((tenant, destination_id(dest)?))
}

/// 404 unless the tenant exists.
pub(super) async fn require_tenant(app: &App, tenant: &TenantId) -> Result<(), ApiError> {
    let entry = app.engine.tenant(tenant).await?;
    if entry.tenant.is_none() {
        return Err(ApiError::unknown_tenant(tenant.as_str()));
    }
    Ok(())
}
