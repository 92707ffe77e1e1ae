//! [`MemoryEntityStore`]: tenants and their destinations in memory.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use async_trait::async_trait;
use parking_lot::RwLock;
use sheaf_store::{
    DeliveryHealth, Destination, DestinationId, DestinationPatch, DisabledReason, EntityStore,
    Error, HealthChange, PreviousSecret, Result, Secret, Tenant, TenantId, TenantUpsert, Timestamp,
    validate_health_reports,
};

struct TenantEntry {
    tenant: Tenant,
    /// By id, which sorts by creation time: the listing order.
    destinations: BTreeMap<DestinationId, Destination>,
}

#[derive(Default)]
struct EntityState {
    tenants: HashMap<TenantId, TenantEntry>,
    /// Which tenant owns each destination id: ids are unique across tenants.
    owners: HashMap<DestinationId, TenantId>,
}

impl EntityState {
    fn destination_mut(
        &mut self,
        tenant: &TenantId,
        id: &DestinationId,
    ) -> Result<&mut Destination> {
        self.tenants
            .get_mut(tenant)
            .and_then(|entry| entry.destinations.get_mut(id))
            .ok_or_else(|| Error::not_found(format!("destination {id} of tenant {tenant}")))
    }
}

/// `now`, or just after `previous` if the clock has not passed it: `updated_at` never goes back.
fn touch(previous: Timestamp) -> Timestamp {
    let now = Timestamp::now();
    if now > previous { now } else { previous }
}

/// The entity store in memory. Cheap to share: wrap it in an `Arc` (`Arc<dyn EntityStore>`).
#[derive(Default)]
pub struct MemoryEntityStore {
    state: RwLock<EntityState>,
}

impl MemoryEntityStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl fmt::Debug for MemoryEntityStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.read();
        f.debug_struct("MemoryEntityStore")
            .field("tenants", &state.tenants.len())
            .field("destinations", &state.owners.len())
            .finish()
    }
}

#[async_trait]
impl EntityStore for MemoryEntityStore {
    async fn upsert_tenant(
        &self,
        id: &TenantId,
        metadata: &BTreeMap<String, String>,
    ) -> Result<TenantUpsert> {
        let mut state = self.state.write();
        if let Some(entry) = state.tenants.get_mut(id) {
            entry.tenant.metadata = metadata.clone();
            entry.tenant.updated_at = touch(entry.tenant.updated_at);
            return Ok(TenantUpsert {
                tenant: entry.tenant.clone(),
                created: false,
            });
        }
        let now = Timestamp::now();
        let tenant = Tenant {
            id: id.clone(),
            metadata: metadata.clone(),
            created_at: now,
            updated_at: now,
        };
        state.tenants.insert(
            id.clone(),
            TenantEntry {
                tenant: tenant.clone(),
                destinations: BTreeMap::new(),
            },
        );
        Ok(TenantUpsert {
            tenant,
            created: true,
        })
    }

    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        Ok(self
            .state
            .read()
            .tenants
            .get(id)
            .map(|entry| entry.tenant.clone()))
    }

    async fn delete_tenant(&self, id: &TenantId) -> Result<()> {
        let mut state = self.state.write();
        let entry = state
            .tenants
            .remove(id)
            .ok_or_else(|| Error::not_found(format!("tenant {id}")))?;
        for destination in entry.destinations.keys() {
            state.owners.remove(destination);
        }
        Ok(())
    }

    async fn create_destination(&self, destination: &Destination) -> Result<()> {
        let mut state = self.state.write();
        if state.owners.contains_key(&destination.id) {
            return Err(Error::conflict(format!(
                "destination id {} is taken",
                destination.id
            )));
        }
        let tenant = &destination.tenant_id;
        let entry = state
            .tenants
            .get_mut(tenant)
            .ok_or_else(|| Error::not_found(format!("tenant {tenant}")))?;
        entry
            .destinations
            .insert(destination.id, destination.clone());
        state.owners.insert(destination.id, tenant.clone());
        Ok(())
    }

    async fn get_destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
    ) -> Result<Option<Destination>> {
        let state = self.state.read();
        Ok(state
            .tenants
            .get(tenant)
            .and_then(|entry| entry.destinations.get(id))
            .cloned())
    }

    async fn list_destinations(&self, tenant: &TenantId) -> Result<Vec<Destination>> {
        let state = self.state.read();
        Ok(state
            .tenants
            .get(tenant)
            .map(|entry| entry.destinations.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn update_destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        patch: &DestinationPatch,
    ) -> Result<Destination> {
        let mut state = self.state.write();
        let destination = state.destination_mut(tenant, id)?;
        patch.apply_to(destination);
        Ok(destination.clone())
    }

    async fn record_delivery_health(
        &self,
        reports: &[DeliveryHealth],
        disable_after: u32,
    ) -> Result<Vec<HealthChange>> {
        validate_health_reports(reports, disable_after)?;
        let mut state = self.state.write();
        let mut changes = Vec::new();
        for report in reports {
            let Ok(destination) = state.destination_mut(&report.tenant_id, &report.destination_id)
            else {
                continue;
            };
            let old = destination.consecutive_failures;
            destination.consecutive_failures = if report.succeeded {
                report.failures_after
            } else {
                old.saturating_add(report.failures_after)
            };
            let recovered = report.succeeded && old >= disable_after;
            let disabled = destination.enabled
                && report.failures_after > 0
                && destination.consecutive_failures >= disable_after;
            if disabled {
                let now = touch(destination.updated_at);
                destination.enabled = false;
                destination.disabled_reason = Some(DisabledReason::after_failures(
                    destination.consecutive_failures,
                    &report.last_error,
                    now,
                ));
                destination.updated_at = now;
            }
            // Both carry the destination as it is afterwards, as the trait says.
            if recovered {
                changes.push(HealthChange::Recovered(destination.clone()));
            }
            if disabled {
                changes.push(HealthChange::Disabled(destination.clone()));
            }
        }
        Ok(changes)
    }

    async fn rotate_secret(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        new_secret: &Secret,
        previous_expires_at: Timestamp,
    ) -> Result<Destination> {
        let mut state = self.state.write();
        let destination = state.destination_mut(tenant, id)?;
        let previous = std::mem::replace(&mut destination.secret, new_secret.clone());
        destination.previous_secret = Some(PreviousSecret {
            secret: previous,
            expires_at: previous_expires_at,
        });
        destination.updated_at = touch(destination.updated_at);
        Ok(destination.clone())
    }

    async fn delete_destination(&self, tenant: &TenantId, id: &DestinationId) -> Result<()> {
        let mut state = self.state.write();
        let entry = state.tenants.get_mut(tenant);
        if entry
            .and_then(|entry| entry.destinations.remove(id))
            .is_none()
        {
            return Err(Error::not_found(format!(
                "destination {id} of tenant {tenant}"
            )));
        }
        state.owners.remove(id);
        Ok(())
    }
}
