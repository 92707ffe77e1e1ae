//! [`Outbox`] conformance: events commit with their jobs and only once per key, settlements
//! commit attempts with outcomes under the lease rule, shipments hand every record over exactly
//! once and give back what they do not commit, key pruning ends the idempotency window, and an
//! accept leases new due jobs to its caller only as offered.
//!
//! Each case takes the outbox, the queue beside it (idle, used by nobody else: a claim takes any
//! due job) and the log store it feeds. An outbox whose log tables are the outbox
//! ([`Outbox::is_log`]) is checked through the log store instead of through shipments.

use std::time::Duration;

use super::assert_kind;
use crate::testkit::fixtures::{attempt, event, trace_context, unique_tenant};
use crate::{
    AttemptKey, DeadLetterRequest, DestinationId, ErrorKind, Event, EventKey, Intake, Job,
    JobQueue, LeaseOffer, LogStore, Outbox, Reschedule, Settlement, TenantId, Timestamp,
};

pub(super) const LEASE: Duration = Duration::from_secs(30);

/// The outbox and the stores beside it.
#[derive(Debug, Clone, Copy)]
pub struct Stores<'a> {
    /// The outbox under test.
    pub outbox: &'a dyn Outbox,
    /// The queue the outbox enqueues into and settles outcomes in.
    pub queue: &'a dyn JobQueue,
    /// The log store: the outbox's own tables, or where its shipments go.
    pub log: &'a dyn LogStore,
}

pub(super) fn intake(tenant: &TenantId, id: &str, destinations: &[DestinationId]) -> Intake {
    let event = event(tenant, id, "order.created", Timestamp::now());
    let jobs = destinations
        .iter()
        .map(|d| Job {
            id: crate::JobId::generate(),
            tenant_id: tenant.clone(),
            event_id: event.id.clone(),
            destination_id: *d,
            attempt_number: 1,
            last_attempt_time: None,
            due_at: Timestamp::now(),
            order_key: None,
        })
        .collect();
    Intake { event, jobs }
}

pub(super) async fn assert_idle(queue: &dyn JobQueue, case: &str) {
    let depth = queue.depth().await.expect("depth");
    assert_eq!(
        depth.due + depth.scheduled + depth.claimed,
        0,
        "{case}: the queue must start idle"
    );
}

/// Every record the outbox still has for the log store, shipped and committed. Returns the
/// events and attempts shipped.
pub(super) async fn ship_all(stores: Stores<'_>) -> (Vec<Event>, Vec<crate::Attempt>) {
    let mut events = Vec::new();
    let mut attempts = Vec::new();
    while let Some(shipment) = stores.outbox.take(100).await.expect("take") {
        stores
            .log
            .insert_many(shipment.events(), shipment.attempts())
            .await
            .expect("log write");
        events.extend_from_slice(shipment.events());
        attempts.extend_from_slice(shipment.attempts());
        shipment.commit().await.expect("commit the shipment");
    }
    (events, attempts)
}

/// Events commit with their jobs; a repeated key, in a later call or the same one, is answered
/// as not new and enqueues nothing, also after its job is gone.
pub async fn accept_commits_each_key_once(stores: Stores<'_>) {
    let case = "accept_commits_each_key_once";
    assert_idle(stores.queue, case).await;
    let tenant = unique_tenant("outbox-accept");
    let (d1, d2) = (DestinationId::generate(), DestinationId::generate());
    let first = intake(&tenant, "evt-1", &[d1, d2]);
    let second = intake(&tenant, "evt-2", &[d1]);
    let again_in_call = intake(&tenant, "evt-2", &[d2]);
    let new = stores
        .outbox
        .accept(&[first.clone(), second.clone(), again_in_call])
        .await
        .expect("accept");
    assert_eq!(new, vec![true, true, false], "{case}: answers per intake");
    let claimed = stores.queue.claim(10, LEASE).await.expect("claim");
    let mut got: Vec<(String, DestinationId)> = claimed
        .iter()
        .map(|c| (c.job.event_id.as_str().to_owned(), c.job.destination_id))
        .collect();
    got.sort();
    let mut want = vec![
        ("evt-1".to_owned(), d1),
        ("evt-1".to_owned(), d2),
        ("evt-2".to_owned(), d1),
    ];
    want.sort();
    assert_eq!(
        got, want,
        "{case}: the jobs of the new events, and only those"
    );

    // The jobs finish; the same ids come again, with other job ids: nothing new.
    let done = Settlement {
        complete: claimed.iter().map(|c| c.lease).collect(),
        ..Settlement::default()
    };
    let lost = stores.outbox.settle(&done).await.expect("settle");
    assert!(lost.is_empty(), "{case}: no lease lost: {lost:?}");
    let again = stores
        .outbox
        .accept(&[
            intake(&tenant, "evt-1", &[d1]),
            intake(&tenant, "evt-2", &[d2]),
        ])
        .await
        .expect("accept again");
    assert_eq!(
        again,
        vec![false, false],
        "{case}: repeats after the jobs are gone"
    );
    assert_idle(stores.queue, case).await;

    // The events reach the log store (at once, or through a shipment) exactly once.
    if !stores.outbox.is_log() {
        let (events, attempts) = ship_all(stores).await;
        let mut ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        ids.sort();
        assert_eq!(
            ids,
            vec!["evt-1", "evt-2"],
            "{case}: each event shipped once"
        );
        assert!(attempts.is_empty(), "{case}: no attempts were made");
    }
    let keys = [first.event.key(), second.event.key()];
    let found = stores.log.get_events(&keys).await.expect("get_events");
    assert_eq!(
        found.get(&keys[0]),
        Some(&first.event),
        "{case}: event 1 in the log"
    );
    assert_eq!(
        found.get(&keys[1]),
        Some(&second.event),
        "{case}: event 2 in the log"
    );
    stores.queue.purge_tenant(&tenant).await.expect("purge");
}

/// A job of another event than its intake's is refused, and the call writes nothing.
pub async fn accept_refuses_stray_jobs(stores: Stores<'_>) {
    let case = "accept_refuses_stray_jobs";
    assert_idle(stores.queue, case).await;
    let tenant = unique_tenant("outbox-stray");
    let good = intake(&tenant, "evt-good", &[DestinationId::generate()]);
    let mut stray = intake(&tenant, "evt-stray", &[DestinationId::generate()]);
    stray.jobs[0].event_id = good.event.id.clone();
    assert_kind(
        stores.outbox.accept(&[good.clone(), stray]).await,
        ErrorKind::InvalidInput,
        case,
    );
    assert_idle(stores.queue, case).await;
    let new = stores.outbox.accept(&[good]).await.expect("accept");
    assert_eq!(new, vec![true], "{case}: the refused call accepted nothing");
    let claimed = stores.queue.claim(10, LEASE).await.expect("claim");
    assert_eq!(claimed.len(), 1, "{case}: one job");
    let lost = stores
        .outbox
        .settle(&Settlement {
            complete: vec![claimed[0].lease],
            ..Settlement::default()
        })
        .await
        .expect("settle");
    assert!(lost.is_empty());
    ship_all(stores).await;
    stores.queue.purge_tenant(&tenant).await.expect("purge");
}

/// An accept may lease some of its new, due jobs to the caller: exactly that many, never a
/// repeat's or a scheduled job's, none claimable until the lease ends, each settled under the
/// lease it came with.
pub async fn accept_leases_new_due_jobs(stores: Stores<'_>) {
    let case = "accept_leases_new_due_jobs";
    assert_idle(stores.queue, case).await;
    let tenant = unique_tenant("outbox-lease");
    let ds: Vec<DestinationId> = (0..3).map(|_| DestinationId::generate()).collect();
    let first = intake(&tenant, "evt-lease-1", &ds);
    let mut later = intake(&tenant, "evt-lease-2", &ds[..1]);
    later.jobs[0].due_at = Timestamp::now().saturating_add(Duration::from_secs(3600));
    let offer = LeaseOffer {
        max_jobs: 2,
        lease: LEASE,
    };
    let accepted = stores
        .outbox
        .accept_leasing(&[first.clone(), later.clone()], offer)
        .await
        .expect("accept");
    assert_eq!(accepted.new, vec![true, true], "{case}: both new");
    assert_eq!(accepted.leased.len(), 2, "{case}: two of three due jobs");
    for claimed in &accepted.leased {
        assert!(
            first.jobs.contains(&claimed.job),
            "{case}: a leased job is a due job of the call, as given: {claimed:?}"
        );
        assert_eq!(
            claimed.lease.job_id, claimed.job.id,
            "{case}: the lease's job"
        );
    }
    let depth = stores.queue.depth().await.expect("depth");
    assert_eq!(
        (depth.claimed, depth.due, depth.scheduled),
        (2, 1, 1),
        "{case}: two held, one due, one scheduled: {depth:?}"
    );
    let claimed = stores.queue.claim(10, LEASE).await.expect("claim");
    assert_eq!(
        claimed.len(),
        1,
        "{case}: only the unleased due job is claimable"
    );
    assert!(
        accepted
            .leased
            .iter()
            .all(|l| l.job.id != claimed[0].job.id),
        "{case}: a claim never returns a leased job"
    );
    // A repeat leases nothing, whatever the offer.
    let repeat = stores
        .outbox
        .accept_leasing(std::slice::from_ref(&first), offer)
        .await
        .expect("accept the repeat");
    assert_eq!(repeat.new, vec![false], "{case}: a repeat");
    assert!(repeat.leased.is_empty(), "{case}: a repeat leases nothing");
    let mut complete: Vec<_> = accepted.leased.iter().map(|c| c.lease).collect();
    complete.push(claimed[0].lease);
    let lost = stores
        .outbox
        .settle(&Settlement {
            complete,
            ..Settlement::default()
        })
        .await
        .expect("settle");
    assert!(lost.is_empty(), "{case}: every lease held: {lost:?}");
    let depth = stores.queue.depth().await.expect("depth");
    assert_eq!(
        (depth.claimed, depth.due, depth.scheduled),
        (0, 0, 1),
        "{case}: only the scheduled job is left: {depth:?}"
    );
    ship_all(stores).await;
    stores.queue.purge_tenant(&tenant).await.expect("purge");
}

/// A settlement records every attempt, also one whose lease is lost, and applies each outcome
/// under the lease rule, in one commit.
pub async fn settle_records_attempts_with_outcomes(stores: Stores<'_>) {
    let case = "settle_records_attempts_with_outcomes";
    assert_idle(stores.queue, case).await;
    let tenant = unique_tenant("outbox-settle");
    let ds: Vec<DestinationId> = (0..4).map(|_| DestinationId::generate()).collect();
    let accepted = intake(&tenant, "evt-settle", &ds);
    stores
        .outbox
        .accept(std::slice::from_ref(&accepted))
        .await
        .expect("accept");
    let claimed = stores.queue.claim(10, LEASE).await.expect("claim");
    assert_eq!(claimed.len(), 4, "{case}: four jobs");
    let now = Timestamp::now();
    let attempts: Vec<crate::Attempt> = claimed
        .iter()
        .map(|c| attempt(&accepted.event, c.job.destination_id, now))
        .collect();
    // The fourth job's lease is stale: a later claim would hold a later `claimed_until`.
    let mut stale = claimed[3].lease;
    stale.claimed_until = stale
        .claimed_until
        .checked_sub(Duration::from_secs(1))
        .expect("in range");
    let settlement = Settlement {
        attempts: attempts.clone(),
        complete: vec![claimed[0].lease, stale],
        reschedule: vec![Reschedule {
            lease: claimed[1].lease,
            due_at: now.saturating_add(Duration::from_secs(3600)),
            attempt_number: 2,
            last_attempt_time: Some(now),
        }],
        dead_letter: vec![DeadLetterRequest {
            lease: claimed[2].lease,
            reason: "gave up".to_owned(),
            hold_key: false,
        }],
    };
    let lost = stores.outbox.settle(&settlement).await.expect("settle");
    assert_eq!(
        lost,
        vec![claimed[3].job.id],
        "{case}: only the stale lease is lost"
    );
    let depth = stores.queue.depth().await.expect("depth");
    assert_eq!(
        (depth.scheduled, depth.claimed, depth.dead_lettered),
        (1, 1, 1),
        "{case}: one rescheduled, one still held, one dead-lettered: {depth:?}"
    );
    if !stores.outbox.is_log() {
        let (_, shipped) = ship_all(stores).await;
        let mut got: Vec<_> = shipped.iter().map(|a| a.id).collect();
        let mut want: Vec<_> = attempts.iter().map(|a| a.id).collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{case}: every attempt shipped once");
        for a in &shipped {
            let made = attempts.iter().find(|m| m.id == a.id).expect("made");
            // The payload may be left out (the trait's `Shipment::attempts`); all else ships
            // as it was made.
            let mut expected = made.clone();
            if a.event_data.value().is_null() {
                expected.event_data = a.event_data.clone();
                expected.event_trace = None;
            }
            assert_eq!(a, &expected, "{case}: an attempt ships as it was made");
        }
    }
    for a in &attempts {
        let key = AttemptKey {
            tenant_id: tenant.clone(),
            event_id: a.event_id.clone(),
            destination_id: a.destination_id,
            attempt_time: now,
        };
        let latest = stores.log.latest_attempt(&key).await.expect("latest");
        assert_eq!(
            latest.as_ref().map(|l| l.id),
            Some(a.id),
            "{case}: attempt in the log"
        );
    }
    stores.queue.purge_tenant(&tenant).await.expect("purge");
}

/// A shipment hides its records from other shipments until it commits; dropped, it gives them
/// back; committed, they are gone from the outbox and from its event reads.
pub async fn shipments_hand_over_each_record_once(stores: Stores<'_>) {
    let case = "shipments_hand_over_each_record_once";
    if stores.outbox.is_log() {
        assert!(
            stores.outbox.take(10).await.expect("take").is_none(),
            "{case}"
        );
        return;
    }
    assert_idle(stores.queue, case).await;
    // Leftovers of earlier cases would be taken too.
    ship_all(stores).await;
    let tenant = unique_tenant("outbox-ship");
    let intakes: Vec<Intake> = (0..5)
        .map(|i| intake(&tenant, &format!("evt-{i}"), &[]))
        .collect();
    stores.outbox.accept(&intakes).await.expect("accept");
    let keys: Vec<EventKey> = intakes.iter().map(|i| i.event.key()).collect();
    let waiting = stores.outbox.get_events(&keys).await.expect("get_events");
    assert_eq!(waiting.len(), 5, "{case}: waiting events are readable");
    let backlog = stores.outbox.backlog().await.expect("backlog");
    assert_eq!(
        (backlog.events, backlog.attempts),
        (5, 0),
        "{case}: {backlog:?}"
    );
    assert!(backlog.oldest.is_some(), "{case}: the oldest time is known");

    let a = stores.outbox.take(3).await.expect("take").expect("records");
    let b = stores
        .outbox
        .take(10)
        .await
        .expect("take")
        .expect("records");
    let ids = |events: &[Event]| -> Vec<String> {
        events.iter().map(|e| e.id.as_str().to_owned()).collect()
    };
    assert_eq!(
        ids(a.events()),
        ["evt-0", "evt-1", "evt-2"],
        "{case}: oldest first"
    );
    assert_eq!(
        ids(b.events()),
        ["evt-3", "evt-4"],
        "{case}: the rest, not shared"
    );
    assert!(
        stores.outbox.take(10).await.expect("take").is_none(),
        "{case}: all held"
    );
    drop(b);
    // A dropped shipment's rollback may reach the server a moment later.
    let mut again = None;
    for _ in 0..50 {
        again = stores.outbox.take(10).await.expect("take");
        if again.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = again.expect("a dropped shipment gives its records back");
    assert_eq!(
        ids(again.events()),
        ["evt-3", "evt-4"],
        "{case}: given back"
    );
    a.commit().await.expect("commit");
    again.commit().await.expect("commit");
    assert!(
        stores.outbox.take(10).await.expect("take").is_none(),
        "{case}: empty"
    );
    let gone = stores.outbox.get_events(&keys).await.expect("get_events");
    assert!(gone.is_empty(), "{case}: shipped events leave the outbox");
    assert_eq!(
        stores.outbox.backlog().await.expect("backlog"),
        crate::OutboxBacklog::default(),
        "{case}: nothing waits"
    );
    // Still known: the idempotency record outlives the payload.
    let repeat = stores.outbox.accept(&intakes[..1]).await.expect("accept");
    assert_eq!(
        repeat,
        vec![false],
        "{case}: a shipped event is still a repeat"
    );
}

/// Pruning forgets keys accepted before the given time, so the id is new again after the
/// idempotency window, but never the key of an event that still waits to be shipped; an outbox
/// whose keys live in the log prunes nothing.
pub async fn pruned_keys_are_accepted_again(stores: Stores<'_>) {
    let case = "pruned_keys_are_accepted_again";
    assert_idle(stores.queue, case).await;
    let tenant = unique_tenant("outbox-prune");
    let first = intake(&tenant, "evt-prune", &[]);
    stores
        .outbox
        .accept(std::slice::from_ref(&first))
        .await
        .expect("accept");
    let past = Timestamp::now()
        .checked_sub(Duration::from_secs(3600))
        .expect("in range");
    assert_eq!(
        stores.outbox.prune_keys(past, 1000).await.expect("prune"),
        0,
        "{case}: nothing is that old"
    );
    let future = Timestamp::now().saturating_add(Duration::from_secs(3600));
    if !stores.outbox.is_log() {
        stores.outbox.prune_keys(future, 1000).await.expect("prune");
        let repeat = stores
            .outbox
            .accept(std::slice::from_ref(&first))
            .await
            .expect("accept");
        assert_eq!(
            repeat,
            vec![false],
            "{case}: an event waiting to be shipped keeps its key"
        );
        let waiting = stores
            .outbox
            .get_events(&[first.event.key()])
            .await
            .expect("get events");
        assert!(
            waiting.contains_key(&first.event.key()),
            "{case}: the waiting event is still there"
        );
        ship_all(stores).await;
    }
    let pruned = stores.outbox.prune_keys(future, 1000).await.expect("prune");
    let again = stores
        .outbox
        .accept(std::slice::from_ref(&first))
        .await
        .expect("accept");
    if stores.outbox.is_log() {
        assert_eq!(pruned, 0, "{case}: keys in the log are not pruned");
        assert_eq!(again, vec![false], "{case}: still a repeat");
    } else {
        assert!(pruned >= 1, "{case}: the key was pruned");
        assert_eq!(again, vec![true], "{case}: new again after its window");
    }
    ship_all(stores).await;
}

/// A traced publish's context is kept with its event in the outbox: its event reads return it,
/// it ships with the event, and the attempts settled for it, shipped or in the log, carry it
/// (or, shipped without their payload, leave it out as they leave the payload out).
pub async fn trace_contexts_travel_with_events(stores: Stores<'_>) {
    let case = "trace_contexts_travel_with_events";
    assert_idle(stores.queue, case).await;
    ship_all(stores).await;
    let tenant = unique_tenant("outbox-trace");
    let d = DestinationId::generate();
    let mut traced = intake(&tenant, "evt-traced", &[d]);
    traced.event.trace = Some(trace_context(7));
    let mut stateless = intake(&tenant, "evt-stateless", &[d]);
    stateless.event.trace = Some(trace_context(8));
    let untraced = intake(&tenant, "evt-untraced", &[d]);
    let intakes = [traced, stateless, untraced];
    let events: Vec<Event> = intakes.iter().map(|i| i.event.clone()).collect();
    stores.outbox.accept(&intakes).await.expect("accept");

    let keys: Vec<EventKey> = events.iter().map(Event::key).collect();
    let waiting = stores.outbox.get_events(&keys).await.expect("get_events");
    for e in &events {
        assert_eq!(
            waiting.get(&e.key()),
            Some(e),
            "{case}: {} as accepted",
            e.id
        );
    }
    let claimed = stores.queue.claim(10, LEASE).await.expect("claim");
    assert_eq!(claimed.len(), 3, "{case}: one job per event");
    let now = Timestamp::now();
    let attempts: Vec<crate::Attempt> = claimed
        .iter()
        .map(|c| {
            let event = events
                .iter()
                .find(|e| e.id == c.job.event_id)
                .expect("its event");
            attempt(event, d, now)
        })
        .collect();
    let settlement = Settlement {
        attempts: attempts.clone(),
        complete: claimed.iter().map(|c| c.lease).collect(),
        ..Settlement::default()
    };
    assert!(
        stores
            .outbox
            .settle(&settlement)
            .await
            .expect("settle")
            .is_empty()
    );

    if !stores.outbox.is_log() {
        let (shipped_events, shipped_attempts) = ship_all(stores).await;
        for e in &events {
            let shipped = shipped_events.iter().find(|s| s.id == e.id);
            assert_eq!(shipped, Some(e), "{case}: {} ships with its context", e.id);
        }
        for a in &shipped_attempts {
            let made = attempts.iter().find(|m| m.id == a.id).expect("made");
            if a.event_data.value().is_null() {
                assert_eq!(a.event_trace, None, "{case}: left out with the payload");
            } else {
                assert_eq!(a.event_trace, made.event_trace, "{case}: shipped as made");
            }
        }
    }
    for e in &events {
        let logged = stores
            .log
            .get_event(&tenant, &e.id)
            .await
            .expect("get_event");
        assert_eq!(logged.as_ref(), Some(e), "{case}: {} in the log", e.id);
    }
    for a in &attempts {
        let latest = stores.log.latest_attempt(&a.key()).await.expect("latest");
        assert_eq!(
            latest.as_ref().map(|l| &l.event_trace),
            Some(&a.event_trace),
            "{case}: the logged attempt of {} carries its event's context",
            a.event_id
        );
    }
    stores.queue.purge_tenant(&tenant).await.expect("purge");
}
