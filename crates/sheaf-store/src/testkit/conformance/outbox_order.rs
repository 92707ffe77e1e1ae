//! [`crate::Outbox`] conformance for ordered jobs: what an intake accepts keeps the order of
//! acceptance per order key.

use super::outbox::{LEASE, Stores, assert_idle, intake, ship_all};
use crate::testkit::fixtures::unique_tenant;
use crate::{DestinationId, Intake, LeaseOffer, Settlement};

/// Jobs of one order key accepted in one call and in a later one are delivered in the order of
/// acceptance: at most the first is leased at once, and each of the others is claimable only
/// once the one before it is done.
pub async fn accepted_jobs_of_an_order_key_keep_the_order_of_acceptance(stores: Stores<'_>) {
    let case = "accepted_jobs_of_an_order_key_keep_the_order_of_acceptance";
    assert_idle(stores.queue, case).await;
    let tenant = unique_tenant("outbox-ordered");
    let d = DestinationId::generate();
    let keyed = |id: &str| {
        let mut intake = intake(&tenant, id, &[d]);
        intake.jobs[0].order_key = Some("order-7".to_owned());
        intake
    };
    let first: Vec<Intake> = ["evt-o-1", "evt-o-2", "evt-o-3"].map(keyed).to_vec();
    let later = keyed("evt-o-4");
    let offer = LeaseOffer {
        max_jobs: 10,
        lease: LEASE,
    };
    let accepted = stores
        .outbox
        .accept_leasing(&first, offer)
        .await
        .expect("accept");
    assert_eq!(accepted.new, vec![true, true, true], "{case}: all new");
    assert!(
        accepted
            .leased
            .iter()
            .all(|l| l.job.id == first[0].jobs[0].id),
        "{case}: only the first of the key may be leased at intake: {:?}",
        accepted.leased
    );
    let accepted_later = stores
        .outbox
        .accept_leasing(std::slice::from_ref(&later), offer)
        .await
        .expect("accept");
    assert!(accepted_later.leased.is_empty(), "{case}: the fourth waits");
    let mut held: Vec<crate::Lease> = accepted.leased.iter().map(|l| l.lease).collect();
    let order: Vec<crate::JobId> = first
        .iter()
        .chain(std::iter::once(&later))
        .map(|i| i.jobs[0].id)
        .collect();
    for (n, expected) in order.iter().enumerate() {
        if held.is_empty() {
            let claimed = stores.queue.claim(10, LEASE).await.expect("claim");
            assert_eq!(
                claimed.iter().map(|c| c.job.id).collect::<Vec<_>>(),
                vec![*expected],
                "{case}: job {n} of the key, alone"
            );
            held = claimed.iter().map(|c| c.lease).collect();
        } else {
            assert_eq!(
                held[0].job_id, *expected,
                "{case}: the leased one is the first"
            );
        }
        let lost = stores
            .outbox
            .settle(&Settlement {
                complete: std::mem::take(&mut held),
                ..Settlement::default()
            })
            .await
            .expect("settle");
        assert!(lost.is_empty(), "{case}: held: {lost:?}");
    }
    ship_all(stores).await;
    stores.queue.purge_tenant(&tenant).await.expect("purge");
}
