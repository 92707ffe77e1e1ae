//! Delivery jobs' ids. A job of (tenant, event, destination) has an id derived from the triple,
//! so enqueueing the same delivery twice is a no-op for the queue; a manual retry's job has a
//! random UUIDv7 instead, which is how a worker tells the two apart.

use sha2::{Digest as _, Sha256};
use sheaf_store::{DestinationId, EventId, JobId, TenantId};

/// The id of the delivery job of (tenant, event, destination): a UUID version 8 whose bits
/// are the start of a SHA-256 of the triple, so enqueueing the same delivery twice is a
/// no-op for the queue (it skips an id it holds).
pub fn delivery_job_id(tenant: &TenantId, event: &EventId, destination: &DestinationId) -> JobId {
    let digest = Sha256::new()
        .chain_update(b"sheaf delivery job\0")
        .chain_update(tenant.as_str().as_bytes())
        .chain_update(b"\0")
        .chain_update(event.as_str().as_bytes())
        .chain_update(b"\0")
        .chain_update(destination.as_uuid().as_bytes())
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    JobId::from_uuid(uuid::Builder::from_custom_bytes(bytes).into_uuid())
}

/// Whether a job is a manual retry (its id is a random UUIDv7, not a derived v8).
pub fn is_manual_job(id: &JobId) -> bool {
    id.as_uuid().get_version_num() == 7
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_job_ids_are_derived_and_version_8() {
        let t = TenantId::new("t").unwrap();
        let e = EventId::new("e").unwrap();
        let d = DestinationId::generate();
        let a = delivery_job_id(&t, &e, &d);
        assert_eq!(a, delivery_job_id(&t, &e, &d));
        assert_ne!(a, delivery_job_id(&t, &EventId::new("f").unwrap(), &d));
        assert!(!is_manual_job(&a));
        assert!(is_manual_job(&JobId::generate()));
    }
}
