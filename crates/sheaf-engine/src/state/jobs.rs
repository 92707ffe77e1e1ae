//! Delivery jobs' ids. A job of (tenant, event, destination) has an id derived from the triple,
//! so enqueueing the same delivery twice is a no-op for the queue; a manual retry's job has a
//! UUIDv7 instead, which is how a worker tells the two apart. A manual retry's is random; a
//! bulk replay's is derived from the replay and the triple, still shaped as a version 7, so a
//! replay that enqueues a page twice (after a takeover) enqueues each delivery once.

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

/// The id of the job a bulk replay enqueues for (tenant, event, destination): a UUID version 7
/// whose timestamp is the replay id's (a replay id is a UUIDv7, so its first 48 bits are its
/// start in milliseconds) and whose other bits are the start of a SHA-256 of the replay id and
/// the triple. A worker takes it for a manual job, and the same replay enqueueing the same
/// delivery twice is a no-op for the queue while the first job is still there.
pub fn replay_job_id(
    replay: &uuid::Uuid,
    tenant: &TenantId,
    event: &EventId,
    destination: &DestinationId,
) -> JobId {
    let digest = Sha256::new()
        .chain_update(b"sheaf replay job\0")
        .chain_update(replay.as_bytes())
        .chain_update(tenant.as_str().as_bytes())
        .chain_update(b"\0")
        .chain_update(event.as_str().as_bytes())
        .chain_update(b"\0")
        .chain_update(destination.as_uuid().as_bytes())
        .finalize();
    let mut millis = [0u8; 8];
    millis[2..].copy_from_slice(&replay.as_bytes()[..6]);
    let mut rest = [0u8; 10];
    rest.copy_from_slice(&digest[..10]);
    JobId::from_uuid(
        uuid::Builder::from_unix_timestamp_millis(u64::from_be_bytes(millis), &rest).into_uuid(),
    )
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

    #[test]
    fn replay_job_ids_are_derived_manual_and_start_with_the_replay() {
        let t = TenantId::new("t").unwrap();
        let e = EventId::new("e").unwrap();
        let d = DestinationId::generate();
        let replay = uuid::Uuid::now_v7();
        let a = replay_job_id(&replay, &t, &e, &d);
        assert_eq!(a, replay_job_id(&replay, &t, &e, &d), "derived");
        assert!(is_manual_job(&a), "a worker takes it for a manual job");
        assert_eq!(
            a.as_uuid().as_bytes()[..6],
            replay.as_bytes()[..6],
            "its timestamp is the replay's"
        );
        assert_ne!(
            a,
            replay_job_id(&uuid::Uuid::now_v7(), &t, &e, &d),
            "per replay"
        );
        assert_ne!(
            a,
            replay_job_id(&replay, &t, &EventId::new("f").unwrap(), &d)
        );
        assert_ne!(a, delivery_job_id(&t, &e, &d));
    }
}
