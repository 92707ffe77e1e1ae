//! The cache of tenants and their destinations in front of the `EntityStore`.
//!
//! Every publish needs its tenant's destinations and every delivery its destination, so both
//! read this cache, one entry per tenant. A change made through this process invalidates the
//! tenant's entry at once; a change made through another process sharing the store is seen
//! when the entry's short time-to-live runs out (`SHEAF_ENTITY_CACHE_TTL`). Concurrent misses
//! for one tenant share a single load (moka's `try_get_with`).

use std::sync::Arc;
use std::time::Duration;

use moka::future::Cache;
use sheaf_store::{Destination, DestinationId, EntityStore, Tenant, TenantId};

/// What the store holds for one tenant.
#[derive(Debug, Clone)]
pub struct TenantEntry {
    /// The tenant, or `None` when it does not exist.
    pub tenant: Option<Tenant>,
    /// Its destinations, oldest first.
    pub destinations: Vec<Destination>,
}

impl TenantEntry {
    /// The destination `id`, if the tenant has it.
    pub fn destination(&self, id: &DestinationId) -> Option<&Destination> {
        self.destinations.iter().find(|d| d.id == *id)
    }
}

/// Tenants and destinations, cached per tenant.
#[derive(Debug, Clone)]
pub struct EntityCache {
    store: Arc<dyn EntityStore>,
    cache: Option<Cache<TenantId, Arc<TenantEntry>>>,
}

/// Tenants kept at most. A tenant's entry is a few destinations; ten thousand of them are a
/// few megabytes.
const MAX_TENANTS: u64 = 10_000;

impl EntityCache {
    /// A cache over `store` whose entries live `ttl` (zero: no caching).
    pub fn new(store: Arc<dyn EntityStore>, ttl: Duration) -> Self {
        let cache = (!ttl.is_zero()).then(|| {
            Cache::builder()
                .max_capacity(MAX_TENANTS)
                .time_to_live(ttl)
                .build()
        });
        Self { store, cache }
    }

    /// The store behind the cache, for writes.
    pub fn store(&self) -> &Arc<dyn EntityStore> {
        &self.store
    }

    async fn load(
        store: Arc<dyn EntityStore>,
        tenant: TenantId,
    ) -> Result<Arc<TenantEntry>, sheaf_store::Error> {
        let Some(found) = store.get_tenant(&tenant).await? else {
            return Ok(Arc::new(TenantEntry {
                tenant: None,
                destinations: Vec::new(),
            }));
        };
        let destinations = store.list_destinations(&tenant).await?;
        Ok(Arc::new(TenantEntry {
            tenant: Some(found),
            destinations,
        }))
    }

    /// The tenant's entry, from the cache or the store.
    pub async fn get(&self, tenant: &TenantId) -> Result<Arc<TenantEntry>, sheaf_store::Error> {
        match &self.cache {
            None => Self::load(Arc::clone(&self.store), tenant.clone()).await,
            Some(cache) => cache
                .try_get_with(
                    tenant.clone(),
                    Self::load(Arc::clone(&self.store), tenant.clone()),
                )
                .await
                .map_err(|err: Arc<sheaf_store::Error>| (*err).clone()),
        }
    }

    /// Forgets the tenant's entry after a change made through this process.
    pub async fn invalidate(&self, tenant: &TenantId) {
        if let Some(cache) = &self.cache {
            cache.invalidate(tenant).await;
        }
    }
}
